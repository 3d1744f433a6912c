"""When an order must be paid by: the fact the order page, its JSON and the emails state, and the
one the deadline, the sweep's expiry pass and checkout's deadline row keep."""

from __future__ import annotations

from datetime import datetime

from flask import current_app

from ..domain.deadlines import unpaid_deadline, unpaid_hold_seconds
from ..domain.order import UNPAID, OrderStatus


def unpaid_hold(status: OrderStatus) -> int:
    """Seconds an unpaid order in `status` holds its stock after its last change: the short hold
    (UNPAID_HOLD_WITHOUT_SESSION_SECONDS) while it never had a payment session, else the window."""
    cfg = current_app.config
    return unpaid_hold_seconds(status, cfg["UNPAID_ORDER_EXPIRY_SECONDS"], cfg["UNPAID_HOLD_WITHOUT_SESSION_SECONDS"])


def pay_by(order) -> datetime | None:
    status = order.status
    if status in UNPAID:
        return unpaid_deadline(order.updated_at, unpaid_hold(status))
    if status is OrderStatus.PAYMENT_INITIATED:
        return order.payment_session_expires_at
    return None
