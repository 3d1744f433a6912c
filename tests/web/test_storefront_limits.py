"""The hoarding limits over HTTP (docs/REFERENCE.md, Storefront and Settings): more than
MAX_LINE_QUANTITY of one item is refused at the cart and at checkout, and a browser or an address
holding UNPAID_ORDERS_PER_CLIENT unpaid orders is told (an address's orders placed elsewhere are
released instead), in words, to pay for or cancel one; the
cart stays, nothing is placed and no stock is taken."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select, update

from factories import on_hand
from payment_helpers import HTML, JSON, Shopper
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import CartItem, InventoryItem, Order

pytestmark = pytest.mark.shop(UNPAID_ORDERS_PER_CLIENT=3, MAX_LINE_QUANTITY=10)

TOO_MANY_UNPAID = "This browser already has 3 orders waiting for payment. Pay for or cancel one of them"


def orders(app):
    with app.app_context():
        try:
            return db.session.execute(select(func.count()).select_from(Order)).scalar_one()
        finally:
            db.session.remove()


def cart_lines(browser):
    return [(i["sku"], i["quantity"]) for i in browser.client.get("/cart", headers=JSON).get_json()["items"]]


# -- MAX_LINE_QUANTITY -----------------------------------------------------------------------------


def test_adding_more_than_the_line_limit_is_refused_in_words_and_changes_nothing(shop, browser):
    r = browser.add("NB-A5-DOT", 11, headers=JSON)  # 40 in stock: the limit, not the stock, refuses
    assert r.status_code == 400
    words = r.get_json()["error"]
    assert words == "At most 10 of one item per order: you asked for 11 of Field Notebook – A5, dot grid."
    assert cart_lines(browser) == []

    assert browser.add("NB-A5-DOT", 6).status_code == 303
    r = browser.add("NB-A5-DOT", 5)  # 6 + 5: what the line would hold counts
    assert r.status_code == 400 and "At most 10 of one item per order: you asked for 11" in r.get_data(as_text=True)
    assert browser.add("NB-A5-DOT", 4).status_code == 303  # exactly the limit is fine
    assert cart_lines(browser) == [("NB-A5-DOT", 10)]


def test_setting_a_line_above_the_limit_is_refused_beside_its_input(shop, browser):
    assert browser.add("NB-A5-DOT", 2).status_code == 303
    variant = shop.skus["NB-A5-DOT"]

    def set_to(quantity, headers=JSON):
        return browser.client.post(
            f"/cart/items/{variant}/quantity", headers=headers, data={"csrf_token": browser.token, "quantity": quantity}
        )

    r = set_to(11)
    assert r.status_code == 400 and r.get_json()["error"].startswith("At most 10 of one item per order")
    page = set_to(12, headers=HTML)
    assert page.status_code == 400
    assert f'id="quantity-{variant}-error"' in page.get_data(as_text=True)  # said where it is fixed
    assert set_to(10).status_code == 200
    assert cart_lines(browser) == [("NB-A5-DOT", 10)]


def test_the_quantity_inputs_carry_the_limit_their_refusal_names_once(shop, browser):
    def maxes(html: str) -> dict[str, str]:
        found = re.findall(r'name="quantity"[^>]*?max="(\d+)"[^>]*?aria-label="Quantity of ([^"]+)"', html)
        return {label: bound for bound, label in found}

    with shop.app_context():
        db.session.execute(
            update(InventoryItem).where(InventoryItem.variant_id == shop.skus["MUG-350-NVY"]).values(on_hand=3)
        )
        db.session.commit()
        db.session.remove()
    catalog = maxes(browser.client.get("/", headers=HTML).get_data(as_text=True))
    assert catalog["NB-A5-DOT"] == "10"  # 40 in stock: the line limit is what the browser holds to
    assert catalog["MUG-350-NVY"] == "3"  # fewer left than the limit: what is left

    assert browser.add("NB-A5-DOT", 2).status_code == 303
    cart = browser.client.get("/cart", headers=HTML).get_data(as_text=True)
    assert 'max="10"' in cart and 'max="99"' not in cart
    variant = shop.skus["NB-A5-DOT"]
    for typed in ("0", "", "lots", "100"):
        page = browser.client.post(
            f"/cart/items/{variant}/quantity", headers=HTML, data={"csrf_token": browser.token, "quantity": typed}
        )
        html = page.get_data(as_text=True)
        assert page.status_code == 400, typed
        # Said once, beside the input, in the shop's words, with the number the input's max holds.
        assert html.count("Choose a quantity from 1 to 10.") == 1, typed
        assert f'id="quantity-{variant}-error"' in html and 'class="flash error"' not in html
        assert "Not a valid integer" not in html and "Quantity: " not in html
    page = browser.add("NB-A5-DOT", 0)
    assert page.status_code == 400 and page.get_data(as_text=True).count("Choose a quantity from 1 to 10.") == 1
    assert cart_lines(browser) == [("NB-A5-DOT", 2)]


def test_the_email_input_holds_the_length_its_refusal_names(shop, browser):
    assert browser.add("NB-A5-DOT", 1).status_code == 303
    assert 'maxlength="254"' in browser.client.get("/cart", headers=HTML).get_data(as_text=True)
    page = browser.checkout_cart("a" * 250 + "@example.com")
    html = page.get_data(as_text=True)
    assert page.status_code == 400
    assert html.count("An email address is at most 254 characters long.") == 1 and "Email: " not in html
    assert orders(shop) == 0


def test_checkout_re_checks_the_line_limit_keeps_the_cart_and_takes_nothing(shop, browser):
    assert browser.add("NB-A5-DOT", 8).status_code == 303
    assert browser.add("NB-A6-DOT", 1).status_code == 303
    with shop.app_context():  # a line filled before the limit was lowered to what it is now
        db.session.execute(update(CartItem).where(CartItem.variant_id == shop.skus["NB-A5-DOT"]).values(quantity=12))
        db.session.commit()

    r = browser.checkout_cart(headers=JSON)

    assert r.status_code == 409
    data = r.get_json()
    assert data["error"].startswith("At most 10 of one item per order; reduce these lines:")
    assert "you asked for 12" in data["error"]
    assert [(line["sku"], line["requested"]) for line in data["over_limit"]] == [("NB-A5-DOT", 12)]
    assert sorted(cart_lines(browser)) == [("NB-A5-DOT", 12), ("NB-A6-DOT", 1)]
    assert orders(shop) == 0 and on_hand("NB-A5-DOT", shop) == 40
    html = browser.checkout_cart().get_data(as_text=True)
    assert "At most 10 of one item per order" in html and "Check out and pay" in html


# -- UNPAID_ORDERS_PER_CLIENT ------------------------------------------------------------------------


def test_a_fourth_unpaid_order_from_one_browser_is_refused_in_words_with_the_cart_kept(shop, browser):
    references = [browser.buy("NB-A5-DOT", 1, email=f"me{i}@example.com") for i in range(3)]
    assert browser.add("NB-A5-DOT", 2).status_code == 303

    r = browser.checkout_cart("new@example.com", headers=JSON)

    assert r.status_code == 409 and r.get_json()["error"].startswith(TOO_MANY_UNPAID)
    assert cart_lines(browser) == [("NB-A5-DOT", 2)]
    assert orders(shop) == 3 and on_hand("NB-A5-DOT", shop) == 40 - 3
    page = browser.checkout_cart("new@example.com")
    assert page.status_code == 409 and TOO_MANY_UNPAID in page.get_data(as_text=True)

    # Cancelling one of them (what the words ask) frees the place.
    order = browser.order(references[0])
    assert browser.cancel(references[0], order["version"]).status_code == 200
    assert browser.checkout_cart("new@example.com").status_code == 303
    assert orders(shop) == 4 and cart_lines(browser) == []


def test_one_address_across_browsers_holds_the_limit_by_releasing_its_oldest_order(shop):
    placed = []
    for spelling in ("ann@example.com", "Ann@example.com", "ANN@example.com"):
        shopper = Shopper(shop)
        assert shopper.checkout("NB-A6-DOT", 1, email=spelling).status_code == 303
        placed.append(shopper.latest()["reference"])
    fourth = Shopper(shop)

    assert fourth.checkout("NB-A6-DOT", 1, email="aNN@EXAMPLE.com").status_code == 303  # not refused

    assert orders(shop) == 4
    with shop.app_context():
        live = db.session.execute(select(Order.reference).where(Order.status != OrderStatus.CANCELLED)).scalars().all()
        db.session.remove()
    assert sorted(live) == sorted(placed[1:] + [fourth.latest()["reference"]])  # the oldest released
