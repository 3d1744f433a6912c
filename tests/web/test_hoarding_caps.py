"""Hoarding bounded without a lock-out (docs/REFERENCE.md, Security): a client address holds at
most UNPAID_ORDERS_PER_ADDRESS live unpaid orders however many fresh cookies and fresh emails it
uses, and a stranger's unpaid orders under someone's email never refuse that person's own
checkout: the address's oldest orders placed from other browsers are released instead (cancelled,
their stock back once), so the address still holds at most UNPAID_ORDERS_PER_CLIENT."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from factories import on_hand
from payment_helpers import JSON, Shopper, run_everything
from shop.domain.order import LIVE_STATUSES, RELEASED_FOR_NEWER, OrderStatus
from shop.extensions import db
from shop.models import Order

PER_ADDRESS = 4
NETWORK_FULL = "Your network address already has 4 orders waiting for payment, the most one address may hold."


def _from(app, address: str) -> Shopper:
    """A fresh browser (its own cookie, its own email) at client address `address`."""
    shopper = Shopper(app)
    shopper.client.environ_base["REMOTE_ADDR"] = address
    return shopper


def _orders(app, email: str | None = None) -> list[tuple[str, str, str | None]]:
    """(reference, status, cancel reason) of every order, of `email` when given, oldest first."""
    with app.app_context():
        query = select(Order.reference, Order.status, Order.cancel_reason).order_by(Order.id)
        if email is not None:
            query = query.where(func.lower(Order.email) == email)
        try:
            return [tuple(row) for row in db.session.execute(query).all()]
        finally:
            db.session.remove()


def _placed_by(shopper: Shopper, email: str, quantity: int = 1) -> str:
    """A checkout by `shopper` for `email`, placed: the order's reference."""
    assert shopper.checkout("NB-A6-DOT", quantity, email=email).status_code == 303
    return shopper.latest()["reference"]


def _live(orders) -> list[str]:
    return [ref for ref, status, _ in orders if status in LIVE_STATUSES]


@pytest.mark.shop(UNPAID_ORDERS_PER_ADDRESS=PER_ADDRESS)
def test_fresh_cookies_and_fresh_emails_from_one_client_address_stop_at_its_limit(shop):
    for _ in range(PER_ADDRESS):  # each checkout a new browser and a new email: both caps pass
        assert _from(shop, "198.51.100.7").checkout("NB-A6-DOT", 5).status_code == 303
    assert on_hand("NB-A6-DOT", shop) == 25 - 5 * PER_ADDRESS
    hoarder = _from(shop, "198.51.100.7")
    assert hoarder.add("NB-A6-DOT", 5).status_code == 303

    refused = hoarder.checkout_cart(headers=JSON)

    assert refused.status_code == 409
    assert refused.get_json()["error"].startswith(NETWORK_FULL)
    assert refused.get_json()["unpaid_limit"] == {"held_by": "client_address", "limit": PER_ADDRESS}
    page = hoarder.checkout_cart()
    assert page.status_code == 409 and NETWORK_FULL in page.get_data(as_text=True)
    assert len(_orders(shop)) == PER_ADDRESS and on_hand("NB-A6-DOT", shop) == 5  # the last five stay on sale
    # Another client address is another customer.
    assert _from(shop, "198.51.100.8").checkout("NB-A6-DOT", 5).status_code == 303


@pytest.mark.shop(sandbox=True, UNPAID_ORDERS_PER_CLIENT=3)
def test_a_strangers_orders_under_your_email_release_to_your_own_checkout(shop):
    victim_email = "vic@example.com"
    planted = [_placed_by(Shopper(shop), victim_email, 2) for _ in range(3)]  # from other browsers
    victim = Shopper(shop)

    placed = victim.checkout("NB-A6-DOT", 1, email="Vic@Example.com")

    assert placed.status_code == 303, placed.get_data(as_text=True)  # to the payment page, not a 409
    orders = _orders(shop, victim_email)
    assert orders[0] == (planted[0], OrderStatus.CANCELLED, RELEASED_FOR_NEWER)  # the oldest placed elsewhere
    assert len(_live(orders)) == 3 and victim.latest()["reference"] in _live(orders)
    run_everything(shop)
    run_everything(shop)  # a redelivery gives nothing back twice
    assert on_hand("NB-A6-DOT", shop) == 25 - 2 * 2 - 1  # the released order's two back, once


@pytest.mark.shop(sandbox=True, UNPAID_ORDERS_PER_CLIENT=3)
def test_a_hoarder_using_someone_elses_email_from_many_browsers_still_holds_at_most_the_limit(shop):
    for round_ in range(7):
        assert Shopper(shop).checkout("NB-A6-DOT", 3, email="vic@example.com").status_code == 303
        assert len(_live(_orders(shop, "vic@example.com"))) == min(round_ + 1, 3)
    run_everything(shop)
    assert on_hand("NB-A6-DOT", shop) == 25 - 3 * 3


@pytest.mark.shop(UNPAID_ORDERS_PER_CLIENT=3)
def test_the_orders_a_browser_placed_itself_are_never_released_for_it(shop):
    browser = Shopper(shop)
    mine = [_placed_by(browser, "vic@example.com") for _ in range(2)]
    elsewhere = _placed_by(Shopper(shop), "vic@example.com")

    assert browser.checkout("NB-A6-DOT", 1, email="vic@example.com").status_code == 303

    orders = _orders(shop, "vic@example.com")
    assert [ref for ref, status, _ in orders if status == OrderStatus.CANCELLED] == [elsewhere]
    assert set(mine) <= set(_live(orders))
