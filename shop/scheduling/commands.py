"""Scheduled command kinds. Each runs inside the command runner's transaction."""

from __future__ import annotations

from datetime import datetime

from .. import emails, mailer
from ..extensions import db
from ..models import Order, ScheduledCommand
from ..orders.cancel import expire_unpaid_order
from ..payments.refunds import execute_refund


def _expire(row: ScheduledCommand, now: datetime) -> None:
    expire_unpaid_order(row.order_id, now)


def _send_email(row: ScheduledCommand, now: datetime) -> None:
    order = db.session.get(Order, row.order_id)
    if order is None:
        return
    template = row.payload.get("template")
    email = emails.render(template, order)
    if email is None:
        # The order moved on since the email was queued ("your items are held, try again" after
        # the customer cancelled, say): an email that would mislead is not sent.
        return
    mailer.send(order.email, email.subject, email.body, key=f"order-{order.id}-{template}-{row.id}")


def _refund(row: ScheduledCommand, now: datetime) -> None:
    execute_refund(row.payload["refund_id"], now)


COMMANDS = {
    "expire_unpaid_order": _expire,
    "send_email": _send_email,
    "refund_payment": _refund,
}
