"""Who is calling the provider: the priority and time budget of the calls made now (a context
variable), which the budget, the bulkhead and the SDK's transport read.

A web request gets the in-request time budget (`init_app`) and background priority; a blueprint
whose requests someone waits on (the storefront, the provider's webhook) says so with
`request_priority`, so the guard never has to know which parts of the web are whose. Workers, the
scheduler and the CLI stay background, without a deadline.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from flask import current_app, g

from ... import clock

if TYPE_CHECKING:
    from .turns import Ticket


class Priority(StrEnum):
    """Whose call it is: a customer's (priority in the rate budget, short timeouts, one retry) or
    background work's (the SDK's retries, leaving a reserve of the budget to customers)."""

    CUSTOMER = "customer"
    BACKGROUND = "background"


@dataclass(frozen=True)
class CallContext:
    priority: Priority
    deadline: float | None = None  # the clock's monotonic() by which the request must have its answer
    # The payment queue's own calls (payments.checkout_queue): a customer's priority and the line's
    # place, but patient: they wait for the budget instead of being refused after a moment, and
    # their first request takes the budget in its turn (the order's place in line).
    in_line: bool = False
    patience: float | None = None
    turn: Ticket | None = None


_context: contextvars.ContextVar[CallContext] = contextvars.ContextVar(
    "backstop_provider_call_context", default=CallContext(Priority.BACKGROUND)
)


def current() -> CallContext:
    return _context.get()


@contextmanager
def customer_call(budget_seconds: float | None = None):
    """Calls made inside the block are a customer's: priority, short timeouts, a deadline."""
    budget = budget_seconds if budget_seconds is not None else current_app.config["STRIPE_REQUEST_BUDGET_SECONDS"]
    token = _context.set(CallContext(Priority.CUSTOMER, clock.current().monotonic() + budget))
    try:
        yield
    finally:
        _context.reset(token)


@contextmanager
def background_call(patience_seconds: float):
    """Background calls made inside the block wait at most `patience_seconds` for the budget, for
    work that would rather be asked again at its turn than hold a worker's thread while it waits
    (a deadline run by a drain, behind which other deadlines wait)."""
    token = _context.set(CallContext(Priority.BACKGROUND, None, patience=patience_seconds))
    try:
        yield
    finally:
        _context.reset(token)


@contextmanager
def queue_call(patience_seconds: float, turn: Ticket | None = None):
    """Calls made inside the block create the session of an order that waited in line: a
    customer's priority in the budget, not held back by the line itself, patient, and (with a
    `turn`) taking the budget in the line's order."""
    token = _context.set(CallContext(Priority.CUSTOMER, None, in_line=True, patience=patience_seconds, turn=turn))
    try:
        yield
    finally:
        _context.reset(token)


@contextmanager
def patient_until(until: float):
    """Calls made inside the block wait for the rate budget until `until` (the clock's monotonic time), and
    never past the caller's own deadline: the retry of a call the provider answered 429 waits out
    the pause the 429 set (its Retry-After) and the budget behind it within the time the caller
    still has, not the moment a first attempt may wait (docs/REFERENCE.md, Settings:
    STRIPE_RATE_LIMIT_PER_SECOND)."""
    token = _context.set(replace(current(), patience=max(0.0, until - clock.current().monotonic())))
    try:
        yield
    finally:
        _context.reset(token)


def init_app(app) -> None:
    """Give every web request the in-request time budget: someone is waiting on the page. Its
    calls are background (the SDK's retries, no priority) unless its blueprint says they are a
    customer's (`request_priority`): the console's "Ask the provider now" stays background but
    within the same deadline, so an operator is told "the provider did not answer" in about 10 s
    and the sweep asks again later. Workers, the scheduler and the CLI have no deadline."""

    @app.before_request
    def _enter_request_context():
        deadline = clock.current().monotonic() + app.config["STRIPE_REQUEST_BUDGET_SECONDS"]
        g._provider_context_token = _context.set(CallContext(Priority.BACKGROUND, deadline))

    @app.teardown_request
    def _leave_request_context(_exc):
        token = g.pop("_provider_context_token", None)
        if token is not None:
            try:
                _context.reset(token)
            except ValueError:  # set in another context (never expected): forget it instead
                _context.set(CallContext(Priority.BACKGROUND))


def request_priority(blueprint, priority: Priority = Priority.BACKGROUND) -> None:
    """The provider calls made by `blueprint`'s requests have `priority`: the web layer says whose
    they are (Priority.CUSTOMER where a person, or the provider's own webhook sender, waits on
    the answer). Runs after `init_app`'s hook (an app's hooks come before a blueprint's), within
    the same deadline; the app's teardown restores the context."""

    @blueprint.before_request
    def _set_priority():
        _context.set(replace(current(), priority=priority))
