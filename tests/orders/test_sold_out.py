"""A sold-out item's buyers cost one read: the checkout refuses a cart whose stock, as last
committed, is short before it takes any lock or writes anything. A flash sale's buyers are
mostly told "sold out"; a whole checkout rolled back at the decrement for each of them is what
the hot item's sale waited behind. The conditional decrement is still what prevents an oversell
(tests/orders/test_checkout.py)."""

from __future__ import annotations

from sqlalchemy import event

from factories import cart_with, catalog_rows, on_hand
from shop.extensions import db
from shop.orders.checkout import place_order


def test_a_checkout_of_a_sold_out_item_is_refused_before_any_lock_or_write(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(0)
        cart, browser = cart_with([(variant, 1)])
        statements: list[str] = []

        def seen(conn, cursor, statement, parameters, context, executemany):
            statements.append(statement.split(None, 1)[0].upper())

        event.listen(db.engine, "before_cursor_execute", seen)
        try:
            refused = place_order(cart_id=cart, browser_id=browser, email=f"{browser}@example.com")
        finally:
            event.remove(db.engine, "before_cursor_execute", seen)

        assert not refused.ok and refused.code == "out_of_stock"
        assert refused.shortages[0]["available"] == 0 and refused.shortages[0]["requested"] == 1
        assert statements == ["SELECT"]  # the cart with its stock: no lock, no insert, no update
        assert on_hand(variant) == 0
