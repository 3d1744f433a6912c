"""What the gateway raises: the provider could not be asked or did not answer
(ProviderUnavailable, with why), it said no (ProviderRefused), or a webhook's signature is wrong
(SignatureProblem)."""

from __future__ import annotations

from enum import StrEnum

from .guard import ShedKind


class ProviderFailure(StrEnum):
    """The provider's own 429 (RATE_LIMITED), or the provider not answering (UNREACHABLE:
    connection errors, timeouts, 5xx)."""

    RATE_LIMITED = "rate_limited"
    UNREACHABLE = "unreachable"


# Why a call could not be made or answered (ProviderUnavailable.kind): the guard's refusals
# (ShedKind) or the provider's failure (ProviderFailure).
UnavailableKind = ShedKind | ProviderFailure
# Refusals that say the provider is fine but its budget (or this process's share of slots) is
# spent for now: an order whose session could not be created for one of these waits in line.
BUDGET_KINDS = frozenset({ShedKind.BUDGET, ShedKind.BULKHEAD, ShedKind.LINE, ProviderFailure.RATE_LIMITED})


class ProviderUnavailable(Exception):
    """The provider could not be reached, timed out, or answered 5xx/429, or the guard refused
    the call: try again later. `kind` says which (see BUDGET_KINDS).

    Durable work that meets it waits for the provider instead of spending its attempt budget
    (the runner reads `failure_kind`; see domain.deadlines.retry_decision)."""

    failure_kind = "provider"
    kind: UnavailableKind = ProviderFailure.UNREACHABLE
    retry_after: float | None = None


class ProviderRefused(Exception):
    """The provider understood and said no (4xx)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class SignatureProblem(Exception):
    """The webhook's signature is missing, wrong or stale."""


def unavailable(message: str, retry_after: float | None, kind: UnavailableKind) -> ProviderUnavailable:
    """ProviderUnavailable, saying why and when to try again if the guard or the provider said (a
    429's Retry-After, the next probe, the rate budget's next token)."""
    exc = ProviderUnavailable(message)
    exc.retry_after = retry_after
    exc.kind = kind
    return exc
