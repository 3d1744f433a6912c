"""Finding an order by a reference that came from outside (a URL, a form, a provider's event):
the order store's `by_reference`, under the name the console knows; and the
order a browser's cart has just become (`just_ordered_by`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from ..domain.deadlines import utcnow
from ..extensions import db
from ..models import Cart, CartState, Order
from ..store.order_store import by_reference as order_by_reference  # noqa: F401

# How long after a checkout another checkout of the same (now closed) cart is told where its order
# went, instead of only that the cart is empty: a double submit, a second tab, a retried POST.
JUST_ORDERED_SECONDS = 600


def just_ordered_by(browser_id: str | None, now: datetime | None = None) -> Order | None:
    """The order this browser's latest cart became, if that happened within JUST_ORDERED_SECONDS:
    what a second checkout of the same cart (which finds no open cart, or loses the race to close
    it) points the customer at. Only the browser's own cart and order: nobody else's."""
    if not browser_id:
        return None
    since = (now or utcnow()) - timedelta(seconds=JUST_ORDERED_SECONDS)
    return db.session.execute(
        select(Order)
        .join(Cart, Cart.order_id == Order.id)
        .where(Cart.browser_id == browser_id, Cart.status == CartState.ORDERED, Order.browser_id == browser_id)
        .where(Order.created_at >= since)
        .order_by(Cart.id.desc())
        .limit(1)
    ).scalar_one_or_none()
