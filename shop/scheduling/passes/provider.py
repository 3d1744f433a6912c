"""The provider pass, one order at a time: a PaymentInitiated order stuck past the cutoff is
asked about at the provider and the answer applied through the webhook's guarded path
(`payments.apply.ask_and_apply`); an answer that will not change by the next cycle backs the
order off. Also: once the provider answers again, the work that waited for it runs now."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from enum import StrEnum

from flask import current_app
from sqlalchemy import select

from ... import failpoints
from ...domain.deadlines import as_utc, next_provider_check
from ...domain.order import OrderStatus
from ...extensions import db
from ...models import Order
from ...outbox import dispatch
from ...payments import apply as payments
from ...provider import gateway, guard
from ...store import order_store
from ...store.order_store import Note
from ..cycle import ProviderOutcome, not_answered
from ..stuck import stuck_age

log = logging.getLogger("shop.sweep")
S = OrderStatus

# A refused payment proof cannot change without an operator: ask again after hours, not cycles.
PROOF_REFUSED_BACKOFF_SECONDS = 6 * 3600


class Backoff(StrEnum):
    """Why the provider pass leaves an order alone for a while."""

    PROOF_REFUSED = "proof_refused"  # for hours
    AWAITING_ASYNC = "awaiting_async"  # a payment still settling: progressively
    WATCHING = "watching"  # a cancelled order watched for late money: progressively


# Answers that may change at any moment but usually do not are asked about again at growing
# intervals (domain.deadlines.next_provider_check), never more than this many sweep intervals
# apart, so a lost webhook costs at most about that long: an async payment still settling (the
# order not Paid, or its stock held), and a cancelled order whose session could still take money
# or whose refund has not gone through (a customer's money kept: tighter).
RECHECK_CAP_INTERVALS = {Backoff.AWAITING_ASYNC: 3, Backoff.WATCHING: 2}


def backoff_provider_checks(order_id: int, why: Backoff, now: datetime, since: datetime | None = None) -> None:
    """Leave the order out of the provider pass for a while after an answer that will not change
    by the next cycle: a refused proof for hours; a payment still settling (or, with `since`, any
    watched cancelled order) progressively, from one interval after `since` up to its cap.

    The order store's `note` of the sweep's own column: bookkeeping, not a state change, so it
    neither bumps the version (a webhook's transition must not lose to it) nor touches
    updated_at (the order's age is what the passes select by)."""
    interval = current_app.config["RECONCILIATION_INTERVAL_SECONDS"]
    if why is Backoff.PROOF_REFUSED:
        due = now + timedelta(seconds=max(PROOF_REFUSED_BACKOFF_SECONDS, interval))
    elif since is not None:
        due = next_provider_check(now, since, interval, RECHECK_CAP_INTERVALS[why] * interval)
    else:
        return
    order_store.note(order_id, Note.NEXT_CHECK, due)
    db.session.commit()


def reconcile_stuck_payment(order_id: int, cutoff: datetime, now: datetime) -> ProviderOutcome:
    """Ask the provider about one PaymentInitiated order and apply the answer through the
    shared guarded path. No transaction is open during the provider call."""
    checked = still_stuck(order_id, cutoff)
    if checked is None:
        return ProviderOutcome.CHANGED
    session_id, reference, stuck_since = checked
    failpoints.hit("sweep.before_provider_call")
    try:
        answer = payments.ask_and_apply(session_id, source="sweep", now=now)
    except gateway.ProviderUnavailable as exc:
        return not_answered(exc, f"order {reference} (session {session_id})")
    return after_answer(order_id, answer.view, answer.applied, now, stuck_since)


def still_stuck(order_id: int, cutoff: datetime) -> tuple[str, str, datetime] | None:
    """(session id, reference, since when it has been stuck) if the order is still waiting at the
    provider past the cutoff after a fresh load, else None. Ends its read transaction."""
    session = db.session
    order = session.get(Order, order_id, populate_existing=True)
    if (
        order is None
        or order.status is not S.PAYMENT_INITIATED
        or not order.payment_session_id
        or as_utc(order.updated_at) >= cutoff
    ):
        session.rollback()
        log.info("sweep: order %s changed since it was selected; the provider pass leaves it", order_id)
        return None
    # The order has been stuck since its window closed: a payment still settling is asked about
    # again soon after that, then less and less often.
    stuck_since = as_utc(order.updated_at) + stuck_age()
    found = (order.payment_session_id, order.reference, stuck_since)
    session.rollback()
    return found


def after_answer(order_id: int, view, applied, now: datetime, stuck_since: datetime) -> ProviderOutcome:
    """What applying the provider's answer did, as a provider-pass outcome; an answer that cannot
    change soon backs the order off (see backoff_provider_checks)."""
    session = db.session
    if applied.outcome == payments.Outcome.NOOP:  # nothing to apply
        status = session.execute(select(Order.status).where(Order.id == order_id)).scalar()
        session.rollback()
        if status is not None and S(status) is S.PAYMENT_INITIATED and view.status == gateway.SessionStatus.OPEN:
            return ProviderOutcome.OPEN
        return ProviderOutcome.CHANGED
    if applied.outcome == payments.Outcome.ALREADY_REFUNDED:
        return ProviderOutcome.CHANGED
    outcome = ProviderOutcome(applied.outcome)
    if outcome is ProviderOutcome.PROOF_REFUSED:
        backoff_provider_checks(order_id, Backoff.PROOF_REFUSED, now)
    elif outcome is ProviderOutcome.AWAITING_ASYNC:
        backoff_provider_checks(order_id, Backoff.AWAITING_ASYNC, now, since=stuck_since)
    return outcome


def wake_work_waiting_for_the_provider(now: datetime) -> int:
    """Once the provider answers again (the breaker closed and the latest call succeeded), work
    that was backing off for it runs now: a refund held back by an outage is made within one
    sweep interval of the provider's return, not at its next retry, up to 300 s later."""
    view = guard.get().breaker_view()
    if view["state"] != guard.CLOSED or int(view.get("failures") or 0):
        return 0
    woken = dispatch.wake_provider_waiters(now)
    if woken:
        log.info("sweep: the provider answers again; %d row(s) waiting for it run now", woken)
    return woken
