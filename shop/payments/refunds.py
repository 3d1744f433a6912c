"""Late money goes back: a paid session for an order that cannot take it (Cancelled, or already
paid through another session) becomes a Refund row plus a durable refund command, in the same
transaction as the webhook/return/sweep notice. The (order, session) unique key makes a second
notice of the same payment refund nothing more; the provider call carries an Idempotency-Key
derived from (order, session), so a retried command never refunds twice."""
from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from ..extensions import db
from ..models import Refund
from ..outbox import schedule_command
from ..outbox.failures import PermanentFailure
from ..store import orders
from ..store.orders import OrderSnapshot
from . import gateway

log = logging.getLogger("shop.payments")


def record_late_payment(order: OrderSnapshot, view, reason: str, now: datetime) -> bool:
    session = db.session
    existing = session.execute(select(Refund.id).where(Refund.order_id == order.id,
                                                       Refund.session_id == view.id)).first()
    if existing:
        return False
    try:
        with session.begin_nested():
            refund = Refund(order_id=order.id, session_id=view.id, payment_intent_id=view.payment_intent,
                            amount=view.amount_total, currency=(view.currency or order.currency), reason=reason,
                            status="pending", created_at=now, updated_at=now)
            session.add(refund)
    except IntegrityError:  # a concurrent notice of the same payment won
        return False
    schedule_command(session, "refund_payment", now, order_id=order.id, payload={"refund_id": refund.id}, now=now)
    log.warning("order %s: %s; refunding %s %s (session %s)", order.reference, reason, view.amount_total,
                view.currency, view.id)
    return True


def execute_refund(refund_id: int, now: datetime) -> None:
    """Runs as a scheduled command; raising lets the runner retry with backoff / dead-letter."""
    refund = db.session.get(Refund, refund_id)
    if refund is None or refund.status == "succeeded":
        return
    intent = refund.payment_intent_id
    if not intent:
        intent = gateway.retrieve_session(refund.session_id).payment_intent
        refund.payment_intent_id = intent
    try:
        result = gateway.create_refund(order_id=refund.order_id, session_id=refund.session_id,
                                       payment_intent=intent, amount=refund.amount, reason=refund.reason)
    except gateway.ProviderRefused as exc:
        refund.last_error = str(exc)
        if exc.code == "charge_already_refunded":
            refund.status = "succeeded"
            _end_watch_when_all_refunded(refund)
            return
        raise PermanentFailure(f"provider refused refund {refund_id}: {exc}") from exc
    refund.provider_refund_id = result.id
    refund.status = "succeeded" if result.status in ("succeeded", "pending") else result.status
    refund.updated_at = now
    log.info("refund %s for order %s: %s at the provider (%s)", refund.id, refund.order_id, refund.status, result.id)
    if refund.status == "succeeded":
        _end_watch_when_all_refunded(refund)
    schedule_command(db.session, "send_email", now, order_id=refund.order_id,
                     payload={"template": "refund_issued"}, now=now)


def _end_watch_when_all_refunded(refund: Refund) -> None:
    """The sweep watches a cancelled order with late money until its refunds have succeeded
    (sweep.check_cancelled_payment); the last one to succeed ends the watch here, in the same
    transaction, rather than a sweep cycle later."""
    db.session.flush()
    others = db.session.execute(select(Refund.id).where(Refund.order_id == refund.order_id, Refund.id != refund.id,
                                                        Refund.status != "succeeded")).first()
    order = orders.current_state(refund.order_id)
    # Only the watched session's own refund: a refund of some older session says nothing about
    # whether the current one can still take money.
    if others is None and order is not None and order.status == "Cancelled" \
            and order.payment_session_id == refund.session_id:
        orders.note(refund.order_id, "stop_watching")
