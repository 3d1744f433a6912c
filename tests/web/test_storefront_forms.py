"""The storefront's forms as a customer meets them: stock problems caught in the cart with their
fix, a sold-out item that cannot be added, an error beside the field it is about, a refused
form that names its GET page, one message per problem, 404 pages that fit the address, and one
badge per order state everywhere it shows."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import update

from payment_helpers import HTML, JSON, Shopper, run_due_commands
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import InventoryItem


def set_stock(app, sku, on_hand):
    with app.app_context():
        db.session.execute(
            update(InventoryItem).where(InventoryItem.variant_id == app.skus[sku]).values(on_hand=on_hand)
        )
        db.session.commit()
        db.session.remove()


def line(html: str, sku: str) -> str:
    """The cart's table row for one item."""
    rows = [r for r in re.findall(r"<tr[^>]*>.*?</tr>", html, re.S) if sku in r]
    assert len(rows) == 1, (sku, rows)
    return rows[0]


def error_row_after(html: str, sku: str) -> str | None:
    """The refusal row right under an item's row (templates/storefront/cart.html), or None."""
    row = line(html, sku)
    found = re.match(r"\s*<tr class=\"line-error\">.*?</tr>", html[html.index(row) + len(row) :], re.S)
    return found.group(0) if found else None


def checkout_button(html: str) -> str:
    return re.search(r"<button[^>]*>Check out and pay</button>", html).group(0)


# -- stock problems in the cart -----------------------------------------------------------------


def test_a_line_asking_for_more_than_is_left_is_marked_and_one_click_reduces_it(shop):
    customer = Shopper(shop)
    assert customer.add("MUG-350-NVY", 3).status_code == 303
    set_stock(shop, "MUG-350-NVY", 1)  # sold elsewhere meanwhile

    html = customer.cart_page()
    row = line(html, "MUG-350-NVY")
    assert 'class="short"' in row and "Only 1 left" in row and "Reduce to 1" in row and ">Remove<" in row
    assert "disabled" in checkout_button(html)
    assert html.count("no longer available in the quantity you chose") == 1

    # "Reduce to 1" is a form of its own posting the quantity that is left.
    reduce_form = re.search(
        r'<form method="post" action="([^"]+/quantity)">\s*<input[^>]*>\s*'
        r'<input type="hidden" name="quantity" value="(\d+)">',
        row,
    )
    assert reduce_form and reduce_form.group(2) == "1"
    r = customer.post(reduce_form.group(1), quantity=reduce_form.group(2))
    assert (r.status_code, r.headers["Location"]) == (303, "/cart")

    html = customer.cart_page()
    assert 'class="short"' not in html and "Only 1 left" not in html
    assert "disabled" not in checkout_button(html)


def test_removing_a_sold_out_line_is_one_click_and_lifts_the_checkout_block(shop):
    customer = Shopper(shop)
    customer.add("MUG-350-NVY", 2)
    customer.add("NB-A5-DOT", 1)
    set_stock(shop, "MUG-350-NVY", 0)

    row = line(customer.cart_page(), "MUG-350-NVY")
    assert "Sold out" in row and "Reduce to" not in row  # nothing to reduce to
    remove = re.search(r'action="([^"]+/delete)"', row).group(1)
    assert customer.post(remove).status_code == 303
    html = customer.cart_page()
    assert "MUG-350-NVY" not in html and "disabled" not in checkout_button(html)


def test_a_sold_out_variant_says_so_in_the_catalog_and_cannot_be_added(shop):
    set_stock(shop, "MUG-350-NVY", 0)
    customer = Shopper(shop)
    catalog = customer.client.get("/", headers=HTML).get_data(as_text=True)
    row = [r for r in re.findall(r"<tr>.*?</tr>", catalog, re.S) if "MUG-350-NVY" in r][0]
    assert "Sold out" in row and re.search(r"<button[^>]*disabled[^>]*>Sold out</button>", row)

    r = customer.add("MUG-350-NVY", 1, headers=JSON)  # a forced POST
    assert r.status_code == 409
    assert r.get_json()["error"].startswith("Sold out") and "Only 0" not in r.get_json()["error"]
    html = customer.add("MUG-350-NVY", 1).get_data(as_text=True)
    assert "Sold out" in html and "Only 0" not in html


# -- errors where they belong -------------------------------------------------------------------


def test_a_bad_email_is_shown_beside_the_email_field_and_the_page_names_the_cart(shop):
    customer = Shopper(shop)
    customer.add("NB-A5-DOT")
    r = customer.post("/checkout", email="not-an-email")
    assert r.status_code == 400  # the refusal keeps its status (docs/REFERENCE.md, Storefront)
    assert r.headers["Content-Location"] == "/cart"
    html = r.get_data(as_text=True)
    assert 'data-address="/cart"' in html  # static/shop.js puts it in the address bar
    field = re.search(r'<input id="email"[^>]*>', html).group(0)
    assert 'aria-invalid="true"' in field and 'aria-describedby="email-error"' in field
    assert re.search(r'<p class="field-error" id="email-error"[^>]*>[^<]*does not look like an email', html)
    assert html.count("does not look like an email address") == 1  # not in a banner as well
    # A JSON client keeps the cart and the error, as before.
    r = customer.post("/checkout", headers=JSON, email="not-an-email")
    assert r.status_code == 400 and "does not look like an email" in r.get_json()["error"]


def test_a_refused_quantity_is_shown_beside_that_lines_quantity(shop):
    customer = Shopper(shop)
    customer.add("MUG-350-NVY", 1)
    customer.add("NB-A5-DOT", 1)
    r = customer.post(f"/cart/items/{shop.skus['MUG-350-NVY']}/quantity", quantity=5)
    assert r.status_code == 409 and r.headers["Content-Location"] == "/cart"
    html = r.get_data(as_text=True)
    refusal = error_row_after(html, "MUG-350-NVY")  # its own full-width row, right under the line
    assert refusal and "Only 3 of Enamel Camp Mug – Navy left" in refusal and 'role="alert"' in refusal
    assert f'aria-describedby="quantity-{shop.skus["MUG-350-NVY"]}-error"' in line(html, "MUG-350-NVY")
    assert html.count("Only 3 of Enamel Camp Mug") == 1
    assert error_row_after(html, "NB-A5-DOT") is None


def test_checking_out_an_empty_cart_says_so_once(shop):
    customer = Shopper(shop)
    r = customer.post("/checkout", email="ann@example.com")
    assert r.status_code == 400
    assert r.get_data(as_text=True).count("Your cart is empty.") == 1


@pytest.mark.parametrize(
    "path, words",
    [
        ("/no-such-page", "There is no page at this address"),
        ("/orders/BK-NOSUCH", "We cannot show this order"),
        ("/checkout/return?order=BK-NOSUCH&session_id=cs_x", "We cannot show this order"),
    ],
)
def test_a_404_page_fits_the_address(shop, path, words):
    client = shop.test_client()
    r = client.get(path, headers=HTML)
    assert r.status_code == 404 and words in r.get_data(as_text=True)
    other = "We cannot show this order" if words.startswith("There") else "There is no page at this address"
    assert other not in r.get_data(as_text=True)
    body = client.get(path, headers=JSON).get_json()
    assert body["status"] == 404 and words in body["error"]


# -- one badge per state ------------------------------------------------------------------------


def _badges(html: str) -> list[str]:
    return re.findall(r'<span class="badge [\w-]+">([^<]+)</span>', html)


def test_the_orders_list_shows_the_same_badge_as_the_order_page(shop):
    customer = Shopper(shop)
    ref = customer.buy("NB-A5-DOT", email="ann@example.com")
    assert _badges(customer.client.get(f"/orders/{ref}", headers=HTML).get_data(as_text=True)) == ["Awaiting payment"]

    run_due_commands(shop, utcnow() + timedelta(seconds=shop.config["UNPAID_ORDER_EXPIRY_SECONDS"] + 5))

    page = customer.client.get(f"/orders/{ref}", headers=HTML).get_data(as_text=True)
    listed = customer.client.get("/orders", headers=HTML).get_data(as_text=True)
    assert _badges(page) == _badges(listed) == ["Expired"]
    # The JSON keeps the state names.
    assert customer.client.get("/orders", headers=JSON).get_json()["orders"][0]["status"] == "Cancelled"
