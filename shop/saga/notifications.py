"""Follow-ups that are pure side effects: they never force a redelivery of their event's other
handlers (each is its own delivery, retried alone).

The confirmation and the cancellation notice are sent by their delivery itself: an SMTP outage
retries that one delivery (backoff, then a dead letter an operator retries), and a cancellation
costs one row of work for its email, not a delivery that schedules a command that sends it (which
cost as much CPU as the restore itself; bench/compensation.py). A failed payment's follow-up
still schedules its email as a command: the same handler re-arms the order's deadline, which a
mail outage must not hold back."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from flask import current_app

from .. import emails, logs
from ..domain.deadlines import as_utc
from ..domain.events import OrderCancelled, OrderPaid, OrderPaymentFailed, OrderPlaced, OrderShipped
from ..domain.order import cancelled_because
from ..extensions import db
from ..models import CommandKind, Order
from ..outbox import schedule_command
from .mail_caps import may_email

log = logging.getLogger("shop.saga")


def payment_failed_followups(event: OrderPaymentFailed, now: datetime) -> None:
    session = db.session
    order = session.get(Order, event.order_id)
    if order is None:
        return
    logs.learn(order_ref=order.reference)
    schedule_command(
        session,
        CommandKind.SEND_EMAIL,
        now,
        order_id=order.id,
        payload={"template": "payment_failed", "attempt": order.payment_attempts},
        now=now,
    )
    cfg = current_app.config
    if cfg["UNPAID_ORDER_EXPIRY_ENABLED"]:
        # A fresh, full window from the failure: never earlier than what the deadline handler
        # will re-derive from the order's last change, or it would fire as a no-op.
        start = max(now, as_utc(order.updated_at))
        schedule_command(
            session,
            CommandKind.EXPIRE_UNPAID_ORDER,
            start + timedelta(seconds=cfg["UNPAID_ORDER_EXPIRY_SECONDS"]),
            order_id=order.id,
            now=now,
        )
    log.info("order %s: payment failed (%s); customer notified and deadline re-armed", order.reference, event.reason)


def send_order_placed_email(event: OrderPlaced, now: datetime) -> None:
    """The customer gets the order's private link as soon as it is placed (a closed tab loses
    nothing); not sent once the order is paid or cancelled, whose own emails carry the link. An
    order is placed once, so the key names the message for good: a redelivery replaces it.
    Within the hourly caps only (saga.mail_caps)."""
    order = db.session.get(Order, event.order_id)
    if order is not None and may_email(order, order.created_at):
        emails.send(event.order_id, "order_placed", tag="event")


def send_order_confirmation(event: OrderPaid, now: datetime) -> None:
    emails.send(event.order_id, "order_paid", tag="event")


def send_shipment_email(event: OrderShipped, now: datetime) -> None:
    """The customer hears their goods left, with the tracking number when the operator gave one.
    An order ships once, so the key names the message for good: a redelivery replaces it."""
    emails.send(event.order_id, "order_shipped", tag="event")


CANCELLATION_EMAILS = {"customer": "order_cancelled", "expired": "order_expired", "hold": "order_hold_ended"}


def send_cancellation_email(event: OrderCancelled, now: datetime) -> None:
    """The customer hears why their order ended: they cancelled it, or its payment window ran out
    (they did not cancel, and may not know). Other cancellations send nothing. (An order is
    paid once and cancelled once, so the key names the message for good: a redelivery replaces it.)"""
    template = CANCELLATION_EMAILS.get(cancelled_because(event.reason))
    if template is None:
        return
    order = db.session.get(Order, event.order_id)
    if order is not None and may_email(order, order.cancelled_at):
        emails.send(event.order_id, template, tag="event")
