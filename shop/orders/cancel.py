"""Order use cases after checkout: the customer's cancel and the payment deadline.

Each is one transaction through the aggregate's guarded transitions; the OrderCancelled event
they record goes to the outbox in the same commit and the compensation handler restores stock.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from flask import current_app

from ..domain.deadlines import as_utc, utcnow
from ..domain.order import CANCELLED_BY_CUSTOMER, PAYMENT_WINDOW_EXPIRED, UNPAID, OrderStatus, Transition
from ..domain.results import Refused
from ..extensions import db
from ..models import CommandKind, ScheduledCommand
from ..outbox import uow
from ..outbox.claims import count_due
from ..outbox.failures import Reschedule
from ..payments import holds
from ..payments.apply import Outcome, apply_event_in_transaction, ask_and_apply
from ..payments.expiry_reads import EXPIRY_GRACE, FIRST_LOOK, known_expiry
from ..payments.start import retire_session_before_cancel
from ..provider import gateway, guard
from ..store import order_store
from ..store.order_store import LoadedOrder
from .deadline import pay_by

log = logging.getLogger("shop.orders")


class CancelStatus(StrEnum):
    CANCELLED = "cancelled"
    CONFLICT = "conflict"  # the order moved: `order` is as it is now, `code` a CancelConflict
    REFUSED = "refused"  # the order cannot be cancelled: the refusal's code and message
    NOT_FOUND = "not_found"


class CancelConflict(StrEnum):
    """How the order moved under a cancel: the route says it in the customer's words."""

    CHANGED_SINCE_SEEN = "stale_version"  # before the cancel: the customer saw an older version
    CHANGED_WHILE_CANCELLING = "changed_while_cancelling"  # between the cancel's look and its commit


@dataclass
class CancelOutcome:
    status: CancelStatus
    order: LoadedOrder | None = None
    code: str = ""
    message: str = ""  # a refusal's own words (the order's or the provider's); empty otherwise


def cancel_order(order_id: int, expected_version: int | None, *, reason: str = CANCELLED_BY_CUSTOMER) -> CancelOutcome:
    """Cancel with the version the customer saw. A stale version changes nothing (409).

    For an order waiting at the provider, the hosted payment page is retired first, inside this
    command: a saga step after the commit could only discover money that already moved. No
    transaction is open across that provider call (on SQLite one would hold the write lock for
    the provider's whole answer); the cancel then commits only if the order is still at the
    version checked, or moved only because of the expiry this cancel caused."""
    order = order_store.read(order_id)
    if order is None:
        return CancelOutcome(CancelStatus.NOT_FOUND)
    shipping = holds.being_shipped(order)  # said before "changed": the ship's ask moved the version
    if shipping is not None:
        return CancelOutcome(CancelStatus.REFUSED, order, shipping.code, shipping.message)
    if expected_version is not None and order.version != expected_version:
        return CancelOutcome(CancelStatus.CONFLICT, order, CancelConflict.CHANGED_SINCE_SEEN)
    if not order.can(Transition.CANCEL):
        refusal = order.cancel(reason)
        assert isinstance(refusal, Refused)  # the transition is not allowed: the guard refuses it
        return CancelOutcome(CancelStatus.REFUSED, order, refusal.code, refusal.message)
    if order.status is OrderStatus.AUTHORIZED:
        return cancel_authorized(order, reason)
    seen, retired, money_may_come = order.version, None, False
    if order.status is OrderStatus.PAYMENT_INITIATED and order.payment_session_id:
        retired = order.payment_session_id
        db.session.rollback()  # no transaction open across the provider call
        verdict = retire_session_before_cancel(order_id, order.reference, retired)
        if isinstance(verdict, Refused):
            return CancelOutcome(CancelStatus.REFUSED, order_store.read(order_id), verdict.code, verdict.message)
        money_may_come = verdict
        order = order_store.read(order_id)
        assert order is not None  # it was just read, and an order is never deleted before it is final
    return _save_cancel(order, seen, reason, retired, money_may_come)


def cancel_authorized(order: LoadedOrder, reason: str) -> CancelOutcome:
    """An Authorized order cancelled before it ships: its hold is voided (a command, after the
    commit), never captured and refunded; its stock comes back through the compensation."""

    def attempt(n: int) -> CancelOutcome:
        current = order_store.read(order.id, fresh=True) if n else order
        assert current is not None  # no writer deletes an order that is not final
        if current.status is not OrderStatus.AUTHORIZED:
            return CancelOutcome(CancelStatus.CONFLICT, current, CancelConflict.CHANGED_WHILE_CANCELLING)
        with uow.transaction():
            refused = holds.cancel_held(current, reason, utcnow())
        if refused is not None:
            return CancelOutcome(CancelStatus.REFUSED, current, refused.code, refused.message)
        return CancelOutcome(CancelStatus.CANCELLED, current)

    return order_store.retry_on_lost_race(2, attempt)


def _save_cancel(
    order: LoadedOrder, seen: int, reason: str, retired: str | None, money_may_come: bool
) -> CancelOutcome:
    """The cancel's guarded save, once more after a lost race that only this cancel's own expiry
    caused (see `_moved_by_this_cancel`)."""
    return order_store.retry_on_lost_race(2, _CancelAttempt(order, seen, reason, retired, money_may_come))


@dataclass
class _CancelAttempt:
    """One try of the cancel's save (`order_store.retry_on_lost_race`): a retry re-reads the order
    and, the version the customer saw being gone, cancels only an order this cancel's expiry moved."""

    order: LoadedOrder
    seen: int
    reason: str
    retired: str | None
    money_may_come: bool

    def __call__(self, attempt: int) -> CancelOutcome:
        if attempt:
            moved = order_store.read(self.order.id)
            assert moved is not None  # another writer moved it; no writer deletes a live order
            self.order = moved
        order = self.order
        if order.version != self.seen:
            moved = _moved_by_this_cancel(order, self.retired)
            if moved == "done":
                return CancelOutcome(CancelStatus.CANCELLED, order)
            if moved != "retry" or attempt:
                return CancelOutcome(CancelStatus.CONFLICT, order, CancelConflict.CHANGED_WHILE_CANCELLING)
            self.seen = order.version
        result = order.cancel(self.reason)
        if isinstance(result, Refused):
            return CancelOutcome(CancelStatus.REFUSED, order, result.code, result.message)
        # The session could still take money (an async payment settling, or a session the cancel
        # could not read or expire): the sweep watches marked cancelled orders, so a lost
        # late-payment webhook cannot leave that money kept. Bookkeeping, same commit.
        watch_from = utcnow() if self.money_may_come else None
        with uow.transaction():
            order_store.save(order, Transition.CANCEL, result.events, watch_from=watch_from)
        log.info("order %s cancelled (%s)", order.reference, self.reason)
        return CancelOutcome(CancelStatus.CANCELLED, order)


def _moved_by_this_cancel(order: LoadedOrder, retired: str | None) -> Literal["done", "retry", "conflict"]:
    """The order moved between the customer's look and the cancel's commit. "done" when it is
    already Cancelled (the notice of the expiry this cancel caused at the provider got there first
    and cancelled it, or the deadline did: what the customer asked for is true); "retry" when the
    only change is the session this cancel retired reported as a failed payment by a path that
    could not tell who expired it (the version the customer saw was current when they asked);
    otherwise "conflict"."""
    status = order.status
    if status is OrderStatus.CANCELLED:
        log.info("order %s: the cancel found it already cancelled", order.reference)
        return "done"
    if retired is not None and order.payment_session_id == retired and status is OrderStatus.PAYMENT_FAILED:
        return "retry"
    return "conflict"


class Expiry(StrEnum):
    """What an unpaid order's expiry did (the deadline's and the sweep's)."""

    CANCELLED = "cancelled"
    LOST_RACE = "lost_race"  # another writer moved the order between the read and the save
    CHANGED = "changed"  # no longer unpaid: nothing to expire
    GONE = "gone"  # the deadline's order no longer exists
    NOT_DUE = "not_due"  # the deadline of an earlier window; a later one is armed


def expire_unpaid_order(order_id: int, now: datetime) -> Expiry | str:
    """The payment deadline, run by the scheduled-command runner inside its transaction.

    What is stored decides, not the row that fired: the due instant is re-derived from the
    order's last change, so an earlier deadline of an order whose payment failed (and got a
    fresh window) is a no-op, and a deadline that fired a little early is re-armed. Returns what
    it did, or for an order at the provider what applying the provider's answer did."""
    order = order_store.read(order_id)
    if order is None:
        return Expiry.GONE
    status = order.status
    if status is OrderStatus.PAYMENT_INITIATED:
        return _expire_at_the_provider(order, now)
    if status not in UNPAID:
        return Expiry.CHANGED
    due = pay_by(order)  # the short hold while it never had a session, else the window
    assert due is not None  # an unpaid order always has a pay-by time
    if due > now:
        if (due - now).total_seconds() <= 5:
            raise Reschedule(due)  # the scheduler fired early (1 s resolution)
        return Expiry.NOT_DUE  # a later deadline row exists for the fresh window
    outcome = cancel_unpaid(order)
    if outcome is Expiry.LOST_RACE:
        log.info("deadline for order %s lost a race to another writer; nothing to do", order_id)
    return outcome


def cancel_unpaid(order: LoadedOrder) -> Expiry:
    """The one unpaid-order expiry, shared by the deadline and the sweep's expiry pass: cancel an
    order still unpaid (PendingPayment / PaymentFailed) whose payment window the caller has found
    over, through the guarded transition, saved by the order store in the caller's transaction
    (the caller commits). Returns Expiry.CANCELLED, LOST_RACE or CHANGED."""
    if order.status not in UNPAID:
        return Expiry.CHANGED
    result = order.cancel(PAYMENT_WINDOW_EXPIRED)
    if isinstance(result, Refused):
        return Expiry.CHANGED
    try:
        order_store.save(order, Transition.CANCEL, result.events)
    except order_store.LostRace:
        # Another writer (a webhook, the customer) moved the order between our read and our save:
        # it won, and retrying would only meet the same conflict. The caller says so in its log.
        uow.rollback(db.session)
        return Expiry.LOST_RACE
    log.info("order %s cancelled: payment window expired", order.reference)
    return Expiry.CANCELLED


# After its session's expires_at: when the deadline first looks (a group of them reads the
# provider's events from then on), how long the provider gets to expire it before a lone deadline
# asks (the sandbox ticks every second; Stripe takes longer), and how long it keeps asking.
PROVIDER_FIRST_LOOK = FIRST_LOOK
PROVIDER_EXPIRY_GRACE = EXPIRY_GRACE
PROVIDER_EXPIRY_PATIENCE = timedelta(minutes=10)
PROVIDER_EXPIRY_RECHECK = timedelta(seconds=15)
# A deadline waits this long at most for its turn in the provider's budget; past that it is asked
# again later, without spending an attempt. Waiting longer would hold a drain's thread, and the
# sessionless deadlines due behind it, for as long as the budget takes to serve every session
# that expired at the same time (bench/deadlines.py --sessions). "Later" is spread over the time
# the budget needs for every deadline due now, so that 200 sessions expiring at one instant ask
# again about once each, not every second each (each asking costs a drain's claim and a write).
PROVIDER_BUDGET_PATIENCE_SECONDS = 0.25
PROVIDER_BUDGET_SPREAD_MIN_SECONDS = 1.0


def _budget_wait(retry_after: float | None, now: datetime) -> float:
    """Seconds until a deadline refused by the provider's budget asks again: the budget's own
    wait, plus a random place among the deadlines due now at the endpoint's rate."""
    waiting = count_due(ScheduledCommand, "kind", CommandKind.EXPIRE_UNPAID_ORDER, now)
    spread = max(
        PROVIDER_BUDGET_SPREAD_MIN_SECONDS, waiting / current_app.config["STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND"]
    )
    return max(retry_after or 0.0, 0.05) + random.uniform(0, spread)


def _expire_at_the_provider(order: LoadedOrder, now: datetime) -> str:
    """The deadline of an order waiting at the hosted payment page. Its session lives until the
    order's pay-by time, so the deadline waits for the session's own expires_at, then asks the
    provider and applies the answer in this transaction through the webhook's guarded path:
    expired -> cancelled (stock back), paid -> Paid (a payment made just in time wins). The
    webhook usually got there first and this is a no-op; this is what keeps the deadline
    punctual when that webhook is lost (the sweep would only find the order a cycle later)."""
    expires = order.payment_session_expires_at
    if expires is not None and now < as_utc(expires) + PROVIDER_FIRST_LOOK:
        raise Reschedule(as_utc(expires) + PROVIDER_FIRST_LOOK)
    # The runner's transaction stays open across this call: it holds the command's claim, which the
    # answer commits with. Unreachable -> raised, and the command is retried with backoff.
    # A PaymentInitiated order has its session: start_payment sets both in the one write.
    assert order.payment_session_id is not None
    try:
        with guard.background_call(PROVIDER_BUDGET_PATIENCE_SECONDS):
            # Many deadlines due together take their sessions' expiries from one read of the
            # provider's events; this one asks alone when that read did not list its session.
            listed = None if expires is None else known_expiry(order.payment_session_id, as_utc(expires), now)
            if listed is not None:
                applied = apply_event_in_transaction(listed, source="deadline", now=now)
                log.info("deadline for order %s at the provider (expiry listed): %s", order.reference, applied.outcome)
                return applied.outcome
            answer = ask_and_apply(order.payment_session_id, source="deadline", now=now, in_transaction=True)
    except gateway.ProviderUnavailable as exc:
        if exc.kind not in gateway.BUDGET_KINDS:
            raise  # the provider is down: the runner's wait for the provider, with its backoff
        raise Reschedule(now + timedelta(seconds=_budget_wait(exc.retry_after, now))) from exc
    view, applied = answer.view, answer.applied
    assert applied is not None  # without `for_order`, ask_and_apply always applies the answer
    if (
        applied.outcome == Outcome.NOOP
        and view.status == gateway.SessionStatus.OPEN
        and expires is not None
        and now < as_utc(expires) + PROVIDER_EXPIRY_PATIENCE
    ):
        raise Reschedule(now + PROVIDER_EXPIRY_RECHECK)  # the provider has not expired it yet
    log.info("deadline for order %s at the provider: %s", order.reference, applied.outcome)
    return applied.outcome
