"""Order use cases after checkout: the customer's cancel and the payment deadline.

Each is one transaction through the aggregate's guarded transitions; the OrderCancelled event
they record goes to the outbox in the same commit and the compensation handler restores stock.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy.orm.exc import StaleDataError

from ..domain.deadlines import as_utc, unpaid_deadline
from ..domain.order import OrderStatus, UNPAID
from ..domain.results import Refused
from ..extensions import db
from ..models import Order
from ..outbox import uow
from .views import status_words

log = logging.getLogger("shop.orders")


@dataclass
class CancelOutcome:
    status: str            # cancelled | conflict | refused | not_found
    order: Order | None = None
    code: str = ""
    message: str = ""


def cancel_order(order_id: int, expected_version: int | None, *, reason: str = "cancelled by customer") -> CancelOutcome:
    """Cancel with the version the customer saw. A stale version changes nothing (409).

    For an order waiting at the provider, the hosted payment page is retired first, inside this
    command: a saga step after the commit could only discover money that already moved."""
    session = db.session
    order = session.get(Order, order_id)
    if order is None:
        return CancelOutcome("not_found")
    if expected_version is not None and order.version != expected_version:
        return CancelOutcome("conflict", order, "stale_version",
                             f"This order changed since you loaded it (it is now: {status_words(order.status)}, "
                             "perhaps in another tab). Look at it again before cancelling.")
    if not order.can("cancel"):
        refusal = order.cancel(reason)
        return CancelOutcome("refused", order, refusal.code, refusal.message)
    if OrderStatus(order.status) is OrderStatus.PAYMENT_INITIATED and order.payment_session_id:
        from ..payments.service import retire_session_before_cancel

        verdict = retire_session_before_cancel(order)
        if isinstance(verdict, Refused):
            session.rollback()
            return CancelOutcome("refused", session.get(Order, order_id), verdict.code, verdict.message)
    result = order.cancel(reason)
    if isinstance(result, Refused):
        return CancelOutcome("refused", order, result.code, result.message)
    try:
        uow.commit(session)
    except StaleDataError:
        uow.rollback(session)
        current = session.get(Order, order_id)
        return CancelOutcome("conflict", current, "stale_version",
                             f"This order changed while you were cancelling it (it is now: "
                             f"{status_words(current.status)}). Look at it again.")
    uow.publish_after_commit(session)
    log.info("order %s cancelled (%s)", order.reference, reason)
    return CancelOutcome("cancelled", order)


def expire_unpaid_order(order_id: int, now: datetime) -> str:
    """The payment deadline, run by the scheduled-command runner inside its transaction.

    What is stored decides, not the row that fired: the due instant is re-derived from the
    order's last change, so an earlier deadline of an order whose payment failed (and got a
    fresh window) is a no-op, and a deadline that fired a little early is re-armed."""
    from ..outbox.runner import Reschedule

    session = db.session
    # The row only (Order's lines and refunds are lazy); no loader options, which would cost a
    # cache key per get.
    order = session.get(Order, order_id)
    if order is None:
        return "gone"
    if OrderStatus(order.status) is OrderStatus.PAYMENT_INITIATED:
        return _expire_at_the_provider(order, now)
    if OrderStatus(order.status) not in UNPAID:
        return f"noop:{order.status}"
    due = unpaid_deadline(order.updated_at, current_app.config["UNPAID_ORDER_EXPIRY_SECONDS"])
    if due > now:
        if (due - now).total_seconds() <= 5:
            raise Reschedule(due)  # the scheduler fired early (1 s resolution)
        return "noop:not_due"  # a later deadline row exists for the fresh window
    order.cancel("payment window expired")
    try:
        session.flush()
    except StaleDataError:
        # A webhook moved the order between our load and our save: it won, and retrying would
        # only hit the same conflict. The command is complete.
        uow.rollback(session)
        log.info("deadline for order %s lost a race to another writer; nothing to do", order_id)
        return "lost_race"
    log.info("order %s cancelled: payment window expired", order.reference)
    return "cancelled"


# After its session's expires_at: how long the provider gets to expire it (the sandbox ticks every
# second; Stripe takes longer) before the deadline asks, and how long it keeps asking.
PROVIDER_EXPIRY_GRACE = timedelta(seconds=2)
PROVIDER_EXPIRY_PATIENCE = timedelta(minutes=10)
PROVIDER_EXPIRY_RECHECK = timedelta(seconds=15)


def _expire_at_the_provider(order: Order, now: datetime) -> str:
    """The deadline of an order waiting at the hosted payment page. Its session lives until the
    order's pay-by time, so the deadline waits for the session's own expires_at, then asks the
    provider and applies the answer in this transaction through the webhook's guarded path:
    expired -> cancelled (stock back), paid -> Paid (a payment made just in time wins). The
    webhook usually got there first and this is a no-op; this is what keeps the deadline
    punctual when that webhook is lost (the sweep would only find the order a cycle later)."""
    from ..outbox.runner import Reschedule
    from ..payments import gateway
    from ..payments.service import apply_in_transaction

    expires = order.payment_session_expires_at
    if expires is not None and now < as_utc(expires) + PROVIDER_EXPIRY_GRACE:
        raise Reschedule(as_utc(expires) + PROVIDER_EXPIRY_GRACE)
    view = gateway.retrieve_session(order.payment_session_id)  # unreachable -> retried with backoff
    applied = apply_in_transaction(view, source="deadline", now=now)
    if applied.outcome == "noop" and view.status == "open" and expires is not None \
            and now < as_utc(expires) + PROVIDER_EXPIRY_PATIENCE:
        raise Reschedule(now + PROVIDER_EXPIRY_RECHECK)  # the provider has not expired it yet
    log.info("deadline for order %s at the provider: %s", order.reference, applied.outcome)
    return applied.outcome
