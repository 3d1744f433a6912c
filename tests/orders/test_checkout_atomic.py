"""A checkout is one local transaction (docs/REFERENCE.md, Guarantees): a checkout that fails
after it has taken stock, before it commits, leaves nothing behind: no order, no event, every
unit still on hand, the cart still open for another try."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from factories import cart_with, catalog_rows
from shop.extensions import db
from shop.models import Cart, InventoryItem, Order, OutboxEvent
from shop.orders.checkout import place_order


def test_a_checkout_that_fails_after_taking_stock_takes_nothing(fresh_ctx, monkeypatch):
    a, b = catalog_rows(5, 4)
    cart_id, browser = cart_with([(a, 2), (b, 3)])
    # The failpoint after each conditional decrement, armed to fail the checkout there.
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "place_order.after_decrement=raise")
    with pytest.raises(RuntimeError, match="failpoint place_order.after_decrement"):
        place_order(cart_id=cart_id, browser_id=browser, email="ann@example.com")
    db.session.rollback()
    stock = dict(db.session.execute(select(InventoryItem.variant_id, InventoryItem.on_hand)).all())
    assert (stock[a], stock[b]) == (5, 4)
    assert db.session.execute(select(func.count()).select_from(Order)).scalar_one() == 0
    assert db.session.execute(select(func.count()).select_from(OutboxEvent)).scalar_one() == 0
    assert db.session.get(Cart, cart_id).status == "open"
    monkeypatch.delenv("BACKSTOP_FAILPOINTS")
    assert place_order(cart_id=cart_id, browser_id=browser, email="ann@example.com").ok
