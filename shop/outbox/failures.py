"""What a handler or scheduled command may raise to tell the runner how its attempt ended.

Small and at the bottom of the outbox on purpose: the use cases (a refund, the deadline) raise
these, so they import this module, never the runner that catches them."""

from __future__ import annotations

from datetime import datetime

from ..domain.deadlines import FAILURE_ERROR, FAILURE_PROVIDER, FAILURE_REFUSED, FailureKind


class PermanentFailure(Exception):
    """A handler's way to say "retrying cannot help": the row goes straight to dead."""

    failure_kind = FAILURE_REFUSED


class DeadEnd(PermanentFailure):
    """Retrying cannot help, and what the handler wrote because of it stands (a capture refused
    because the hold lapsed cancels the order): its writes commit with the row marked dead, in
    one transaction, and the message is the dead letter's words for an operator."""


class Reschedule(Exception):
    """Not due yet (a scheduler may fire up to a second early): run again at `due`, without
    spending an attempt."""

    def __init__(self, due: datetime):
        super().__init__(f"not due until {due.isoformat()}")
        self.due = due


# How the console and last_error name a row that failed only because the provider did not answer.
WAITING_FOR_PROVIDER = "waiting for the provider"


def failure_kind(exc: BaseException) -> FailureKind:
    """How a failed attempt counts (domain.deadlines.retry_decision): an exception declares it
    with a `failure_kind` attribute (PermanentFailure, gateway.ProviderUnavailable), directly or
    as the cause it was raised from; anything else is an ordinary error."""
    seen = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        kind = getattr(cause, "failure_kind", None)
        if kind in (FAILURE_REFUSED, FAILURE_PROVIDER):
            return FailureKind(kind)
        cause = cause.__cause__
    return FAILURE_ERROR
