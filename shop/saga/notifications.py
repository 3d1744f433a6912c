"""Follow-ups that are pure side effects: they never force a redelivery of their event.
Each turns its work into durable scheduled commands (with their own retries and dead letters)
instead of doing it inline, so an SMTP outage retries one email, not the whole event."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from flask import current_app

from ..domain.deadlines import as_utc
from ..domain.events import OrderPaid, OrderPaymentFailed
from ..extensions import db
from ..models import Order
from ..outbox import schedule_command

log = logging.getLogger("shop.saga")


def payment_failed_followups(event: OrderPaymentFailed, now: datetime) -> None:
    session = db.session
    order = session.get(Order, event.order_id)
    if order is None:
        return
    schedule_command(session, "send_email", now, order_id=order.id,
                     payload={"template": "payment_failed", "attempt": order.payment_attempts}, now=now)
    cfg = current_app.config
    if cfg["UNPAID_ORDER_EXPIRY_ENABLED"]:
        # A fresh, full window from the failure: never earlier than what the deadline handler
        # will re-derive from the order's last change, or it would fire as a no-op.
        start = max(now, as_utc(order.updated_at))
        schedule_command(session, "expire_unpaid_order", start + timedelta(seconds=cfg["UNPAID_ORDER_EXPIRY_SECONDS"]),
                         order_id=order.id, now=now)
    log.info("order %s: payment failed (%s); customer notified and deadline re-armed", order.reference, event.reason)


def send_order_confirmation(event: OrderPaid, now: datetime) -> None:
    schedule_command(db.session, "send_email", now, order_id=event.order_id,
                     payload={"template": "order_paid"}, now=now)
