"""A checkout for an email address whose live unpaid orders, placed from other browsers, fill
UNPAID_ORDERS_PER_CLIENT (docs/ARCHITECTURE.md, Conditional decrement): the new checkout
proceeds, and the address's oldest such orders are released to make room for it.

Why release and not refuse: anyone may type anyone's address, so a refusal let a stranger's three
unpaid orders lock the address's owner out of checkout for the payment window, again and again.
Releasing still bounds what one address holds (a hoarder using it only releases their own older
orders), costs its owner nothing they cannot redo, and a hoarder's browser and client address are
bounded by their own limits. A release is the customer's cancel path (`cancel_order`, the payment
page retired first), so the stock comes back once through the compensation. Orders of this same
browser are never released: the browser's own limit speaks for them.
"""

from __future__ import annotations

from flask import current_app
from sqlalchemy import func, select

from ..domain.order import LIVE_STATUSES, RELEASED_FOR_NEWER
from ..extensions import db
from ..models import Order
from .cancel import CancelStatus, cancel_order
from .checkout import CheckoutRefused, HeldBy, Placed, normalized_email, place_order


def release_elsewhere(email: str, browser_id: str) -> int:
    """Cancel, oldest first, as many live orders of `email` placed from other browsers as it takes
    to leave the address room for one more; how many were cancelled."""
    rows = db.session.execute(
        select(Order.id, Order.browser_id)
        .where(func.lower(Order.email) == normalized_email(email), Order.status.in_(LIVE_STATUSES))
        .order_by(Order.created_at, Order.id)
    ).all()
    db.session.rollback()  # no transaction open across the cancels' provider calls
    excess = len(rows) - current_app.config["UNPAID_ORDERS_PER_CLIENT"] + 1
    released = 0
    for order_id in [row.id for row in rows if row.browser_id != browser_id]:
        if released >= excess:
            break
        if cancel_order(order_id, None, reason=RELEASED_FOR_NEWER).status is CancelStatus.CANCELLED:
            released += 1
    return released


def place_order_releasing(
    *, cart_id: int, browser_id: str, email: str, in_line: bool, client_address: str | None
) -> Placed | CheckoutRefused:
    """`place_order`; refused only because the email's orders from other browsers fill its limit,
    those are released (above) and the checkout tried once more."""

    def place() -> Placed | CheckoutRefused:
        return place_order(
            cart_id=cart_id, browser_id=browser_id, email=email, in_line=in_line, client_address=client_address
        )

    result = place()
    if isinstance(result, CheckoutRefused) and result.held_by is HeldBy.ADDRESS:
        if release_elsewhere(email, browser_id):
            result = place()
    return result
