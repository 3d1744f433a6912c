"""When an order must be paid by: the fact the order page, its JSON and the emails state."""

from __future__ import annotations

from datetime import datetime

from flask import current_app

from ..domain.deadlines import unpaid_deadline
from ..domain.order import OrderStatus, UNPAID


def pay_by(order) -> datetime | None:
    status = order.status
    if status in UNPAID:
        return unpaid_deadline(order.updated_at, current_app.config["UNPAID_ORDER_EXPIRY_SECONDS"])
    if status is OrderStatus.PAYMENT_INITIATED:
        return order.payment_session_expires_at
    return None
