"""The hoarding limits at checkout (docs/REFERENCE.md, Settings and Guarantees): one browser, or one
email address, holds at most UNPAID_ORDERS_PER_CLIENT live unpaid orders, however many checkouts
race, and no line holds more than MAX_LINE_QUANTITY. A refused checkout writes nothing and takes
no stock; paying for or cancelling an order frees a place."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from sqlalchemy import func, select

from factories import cart_with, catalog_rows, on_hand, transitioned
from shop.domain.order import Transition as T
from shop.extensions import db
from shop.models import Cart, Order, OrderLine, OutboxEvent, ScheduledCommand
from shop.orders.checkout import HeldBy, Refusal, place_order
from support import run_threads


def count(model) -> int:
    return db.session.execute(select(func.count()).select_from(model)).scalar_one()


LIMIT = 3


@pytest.fixture
def limited_app(make_fresh_app):
    """The shop with the documented defaults (3 unpaid orders per client, 10 of one item)."""
    return make_fresh_app(UNPAID_ORDERS_PER_CLIENT=LIMIT, MAX_LINE_QUANTITY=10)


def _checkout(variant, browser, email="ann@example.com", quantity=1):
    cart_id, _ = cart_with([(variant, quantity)], browser)
    return cart_id, place_order(cart_id=cart_id, browser_id=browser, email=email)


def _nothing_written_for(cart_id, before_orders):
    assert count(Order) == before_orders
    assert count(OrderLine) == before_orders
    assert count(OutboxEvent) == before_orders  # one OrderPlaced per placed order, none more
    assert count(ScheduledCommand) == before_orders  # one deadline per placed order
    assert db.session.get(Cart, cart_id).status == "open"  # the cart is kept for later


def test_a_fourth_unpaid_checkout_from_one_browser_is_refused_and_takes_no_stock(limited_app):
    with limited_app.app_context():
        (variant,) = catalog_rows(20)
        browser = uuid.uuid4().hex
        for i in range(LIMIT):  # a new address each time: only the browser is the same
            _, placed = _checkout(variant, browser, f"buyer{i}@example.com", 2)
            assert placed.ok, placed

        cart_id, refused = _checkout(variant, browser, "someone.else@example.com", 2)

        assert not refused.ok and refused.code is Refusal.TOO_MANY_UNPAID and refused.limit == LIMIT
        db.session.remove()
        assert on_hand(variant) == 20 - 2 * LIMIT
        _nothing_written_for(cart_id, LIMIT)


def test_one_address_from_different_browsers_is_counted_whatever_its_case_and_spaces(limited_app):
    with limited_app.app_context():
        (variant,) = catalog_rows(20)
        for spelling in ("ann@example.com", "Ann@Example.com", "ANN@EXAMPLE.COM"):
            _, placed = _checkout(variant, uuid.uuid4().hex, spelling)
            assert placed.ok, placed

        cart_id, refused = _checkout(variant, uuid.uuid4().hex, "  aNN@example.com ")

        assert not refused.ok and refused.code is Refusal.TOO_MANY_UNPAID
        db.session.remove()
        assert on_hand(variant) == 20 - LIMIT
        _nothing_written_for(cart_id, LIMIT)
        # Another address from yet another browser is another customer.
        assert _checkout(variant, uuid.uuid4().hex, "bob@example.com")[1].ok


@pytest.mark.parametrize("frees", ["paid", "cancelled"])
def test_paying_or_cancelling_an_order_frees_a_place_and_an_order_at_the_payment_page_does_not(limited_app, frees):
    with limited_app.app_context():
        (variant,) = catalog_rows(20)
        browser = uuid.uuid4().hex
        orders = [_checkout(variant, browser)[1].order_id for _ in range(LIMIT)]
        # At the provider's payment page (PaymentInitiated) an order still holds its stock: it counts.
        transitioned(orders[0], (T.START_PAYMENT, lambda o: o.start_payment("cs_hoard", None)))
        assert _checkout(variant, browser)[1].code is Refusal.TOO_MANY_UNPAID

        if frees == "paid":
            transitioned(orders[0], (T.MARK_PAID, lambda o: o.mark_paid("cs_hoard", o.total, o.currency)))
        else:
            transitioned(orders[1], (T.CANCEL, lambda o: o.cancel("cancelled by customer")))

        _, placed = _checkout(variant, browser)
        assert placed.ok, placed
        assert _checkout(variant, browser)[1].code is Refusal.TOO_MANY_UNPAID  # full again


def test_a_cart_line_over_the_line_limit_is_refused_at_checkout_naming_it(limited_app):
    with limited_app.app_context():
        fine, over = catalog_rows(50, 50)
        cart_id, browser = cart_with([(fine, 10), (over, 11)])  # as a cart filled before the limit was lowered

        refused = place_order(cart_id=cart_id, browser_id=browser, email="ann@example.com")

        assert not refused.ok and refused.code is Refusal.TOO_MANY_OF_ONE and refused.limit == 10
        assert [(line["variant_id"], line["requested"]) for line in refused.over] == [(over, 11)]
        db.session.remove()
        assert (on_hand(fine), on_hand(over)) == (50, 50)
        _nothing_written_for(cart_id, 0)


def test_concurrent_checkouts_from_one_browser_place_at_most_the_limit(limited_app, monkeypatch):
    # Each checkout holds its transaction open a little longer (a failpoint after each decrement),
    # so without the per-browser lock every one would count the same committed orders and pass.
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "place_order.after_decrement=sleep:0.05")
    clients = 8
    with limited_app.app_context():
        (variant,) = catalog_rows(100)
        browser = uuid.uuid4().hex
        carts = [cart_with([(variant, 1)], browser)[0] for _ in range(clients)]

    results, errors = run_threads(
        limited_app,
        list(enumerate(carts)),
        lambda job: place_order(cart_id=job[1], browser_id=browser, email=f"tab{job[0]}@example.com"),
    )

    assert errors == [None] * clients, [repr(e) for e in errors if e]
    outcomes = Counter("placed" if r.ok else r.code for r in results)
    assert outcomes == {"placed": LIMIT, Refusal.TOO_MANY_UNPAID: clients - LIMIT}
    with limited_app.app_context():
        assert count(Order) == LIMIT and on_hand(variant) == 100 - LIMIT


def test_concurrent_checkouts_of_one_address_from_many_browsers_place_at_most_the_limit(limited_app, monkeypatch):
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "place_order.after_decrement=sleep:0.05")
    clients = 8
    with limited_app.app_context():
        (variant,) = catalog_rows(100)
        carts = [cart_with([(variant, 1)]) for _ in range(clients)]

    results, errors = run_threads(
        limited_app, carts, lambda c: place_order(cart_id=c[0], browser_id=c[1], email="Ann@Example.com")
    )

    assert errors == [None] * clients, [repr(e) for e in errors if e]
    outcomes = Counter("placed" if r.ok else r.code for r in results)
    assert outcomes == {"placed": LIMIT, Refusal.TOO_MANY_UNPAID: clients - LIMIT}
    with limited_app.app_context():
        assert count(Order) == LIMIT and on_hand(variant) == 100 - LIMIT


def test_concurrent_checkouts_from_one_client_address_with_fresh_browsers_and_emails_place_at_most_its_limit(
    make_fresh_app, monkeypatch
):
    # A fresh cookie and a fresh email per checkout pass the browser and email limits; only the
    # client address (UNPAID_ORDERS_PER_ADDRESS, its own lock) holds them.
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "place_order.after_decrement=sleep:0.05")
    app, clients, per_address = make_fresh_app(UNPAID_ORDERS_PER_ADDRESS=4), 8, 4
    with app.app_context():
        (variant,) = catalog_rows(100)
        carts = [cart_with([(variant, 1)]) for _ in range(clients)]

    results, errors = run_threads(
        app,
        list(enumerate(carts)),
        lambda job: place_order(
            cart_id=job[1][0], browser_id=job[1][1], email=f"fresh{job[0]}@example.com", client_address="203.0.113.5"
        ),
    )

    assert errors == [None] * clients, [repr(e) for e in errors if e]
    outcomes = Counter("placed" if r.ok else r.held_by for r in results)
    assert outcomes == {"placed": per_address, HeldBy.CLIENT_ADDRESS: clients - per_address}
    with app.app_context():
        assert count(Order) == per_address and on_hand(variant) == 100 - per_address
