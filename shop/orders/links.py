"""The links to an address's orders waiting for payment, emailed to that address on request
(docs/REFERENCE.md, Storefront: POST /orders/links).

A checkout refused because the address already holds UNPAID_ORDERS_PER_CLIENT live orders placed
from another browser cannot show those orders to this browser: whoever typed the address may not
own it. What it can do is email each order's private link (its page with its access token) to the
address itself, whose owner can then pay for or cancel one. Each email is one `send_email` command
(template `order_link`), the same durable path as the shop's other emails, rendered when it is
sent and skipped once the order no longer waits for payment. The caller answers the same whether
or not the address has such orders, so the request tells the asker nothing.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from ..domain.deadlines import utcnow
from ..domain.order import LIVE_STATUSES
from ..models import CommandKind, Order
from ..outbox import schedule_command, uow
from .checkout import normalized_email

TEMPLATE = "order_link"


def email_order_links(email: str, now: datetime | None = None) -> int:
    """Schedule the `order_link` email of every live unpaid order of `email` (compared as the
    unpaid-order limit compares it) in one transaction; how many were scheduled."""
    now = now or utcnow()
    address = normalized_email(email)
    with uow.transaction() as session:
        ids = (
            session.execute(
                select(Order.id)
                .where(func.lower(Order.email) == address, Order.status.in_(LIVE_STATUSES))
                .order_by(Order.id)
            )
            .scalars()
            .all()
        )
        for order_id in ids:
            schedule_command(
                session, CommandKind.SEND_EMAIL, now, order_id=order_id, payload={"template": TEMPLATE}, now=now
            )
    return len(ids)
