"""Scheduled command kinds. Each runs inside the command runner's transaction."""
from __future__ import annotations

from datetime import datetime

from flask import current_app

from .. import mailer
from ..extensions import db
from ..models import Order, ScheduledCommand
from ..orders.commands import expire_unpaid_order


def _expire(row: ScheduledCommand, now: datetime) -> None:
    expire_unpaid_order(row.order_id, now)


TEMPLATES = {
    "order_paid": ("Your order {ref} is paid",
                   "Thank you! We received your payment of {amount} for order {ref}.\n\n{link}\n"),
    "payment_failed": ("Your payment for order {ref} did not go through",
                       "Your payment for order {ref} did not go through. Your items are held for you until "
                       "{deadline}; you can try again here:\n\n{link}\n"),
    "refund_issued": ("A refund for order {ref}",
                      "Your payment for order {ref} arrived after the order was cancelled, so we refunded "
                      "{amount}.\n\n{link}\n"),
}


def _send_email(row: ScheduledCommand, now: datetime) -> None:
    order = db.session.get(Order, row.order_id)
    if order is None:
        return
    template = row.payload.get("template")
    if template == "payment_failed" and order.status != "PaymentFailed":
        # "Your items are held, try again" is no longer true once the order moved on (the
        # customer cancelled just after, or paid): an email that would mislead is not sent.
        return
    subject, body = TEMPLATES[template]
    base = current_app.config["PUBLIC_BASE_URL"]
    link = f"{base}/orders/{order.reference}?token={order.access_token}"
    amount = f"{order.total / 100:.2f} {order.currency.upper()}"
    from ..orders.views import pay_by

    deadline = pay_by(order)
    fields = dict(ref=order.reference, amount=amount, link=link,
                  deadline=deadline.strftime("%Y-%m-%d %H:%M UTC") if deadline else "the end of the payment window")
    mailer.send(order.email, subject.format(**fields), body.format(**fields), key=f"order-{order.id}-{template}-{row.id}")


def _refund(row: ScheduledCommand, now: datetime) -> None:
    from ..payments.refunds import execute_refund

    execute_refund(row.payload["refund_id"], now)


COMMANDS = {
    "expire_unpaid_order": _expire,
    "send_email": _send_email,
    "refund_payment": _refund,
}
