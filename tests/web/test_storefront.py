"""The storefront over HTTP (docs/REFERENCE.md, Storefront), as a browser uses it: JSON shapes, the cart's
refusals in words, CSRF, checkout refusals, double submits, cancellation with the version the
customer saw, and who may see an order."""

from __future__ import annotations

import re
import threading

import pytest
from sqlalchemy import func, select

from factories import force_order, on_hand
from payment_helpers import HTML, JSON, Shopper
from shop.extensions import db
from shop.models import Cart, Order, OutboxDelivery, OutboxEvent

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def rows(app, model, *where):
    with app.app_context():
        try:
            return db.session.execute(select(func.count()).select_from(model).where(*where)).scalar_one()
        finally:
            db.session.remove()


# -- catalog and cart ----------------------------------------------------------------------------


def test_the_catalog_json_has_exactly_the_contract_shape_with_live_stock(shop, browser):
    data = browser.client.get("/", headers=JSON).get_json()
    assert list(data) == ["products"]
    variants = {}
    for product in data["products"]:
        assert set(product) == {"id", "name", "variants"}
        assert isinstance(product["id"], int) and isinstance(product["name"], str)
        for v in product["variants"]:
            assert set(v) == {"id", "sku", "name", "price", "currency", "available"}
            assert isinstance(v["price"], int) and isinstance(v["available"], int)
            variants[v["sku"]] = v
    assert variants["MUG-350-NVY"] == {
        "id": shop.skus["MUG-350-NVY"],
        "sku": "MUG-350-NVY",
        "name": "Navy",
        "price": 1800,
        "currency": "usd",
        "available": 3,
    }
    assert variants["SOCK-L"]["available"] == 0
    browser.buy("MUG-350-NVY", 2)
    again = browser.client.get("/", headers=JSON).get_json()
    assert {v["sku"]: v["available"] for p in again["products"] for v in p["variants"]}["MUG-350-NVY"] == 1
    html = browser.client.get("/", headers=HTML).get_data(as_text=True)
    assert "Enamel Camp Mug" in html and "18.00" in html


def test_adding_a_bad_quantity_is_a_400_in_words(browser):
    for quantity, words in [
        ("0", "Choose a quantity from 1 to 10."),
        ("100", "Choose a quantity from 1 to 10."),
        ("lots", "Choose a quantity from 1 to 10."),
        ("", "Choose a quantity from 1 to 10."),
    ]:
        r = browser.add("NB-A5-DOT", quantity, headers=JSON)
        assert r.status_code == 400, quantity
        assert words in r.get_json()["error"], (quantity, r.get_json())
    assert browser.client.get("/cart", headers=JSON).get_json()["items"] == []


def test_adding_an_unknown_variant_is_a_404(browser):
    r = browser.client.post(
        "/cart/items", headers=JSON, data={"csrf_token": browser.token, "variant_id": 999999, "quantity": 1}
    )
    assert r.status_code == 404 and "not for sale" in r.get_json()["error"]


def test_adding_more_than_is_available_is_a_409_saying_how_many_are_left(shop, browser):
    assert browser.add("MUG-350-NVY", 2).status_code == 303
    r = browser.add("MUG-350-NVY", 2, headers=JSON)
    assert r.status_code == 409
    assert r.get_json()["error"] == "Only 3 of Enamel Camp Mug – Navy left; you asked for 4."
    cart = browser.client.get("/cart", headers=JSON).get_json()
    assert [(i["sku"], i["quantity"], i["available"]) for i in cart["items"]] == [("MUG-350-NVY", 2, 3)]
    assert cart["total"] == 3600 and cart["currency"] == "usd"


def test_a_post_without_its_csrf_token_is_a_400_with_a_clear_message_and_changes_nothing(shop, browser):
    r = browser.client.post("/cart/items", headers=HTML, data={"variant_id": shop.skus["NB-A5-DOT"], "quantity": 1})
    assert r.status_code == 400 and "form expired" in r.get_data(as_text=True).lower()
    browser.add("NB-A5-DOT")
    r = browser.client.post("/checkout", headers=JSON, data={"email": "ann@example.com", "csrf_token": "forged"})
    assert r.status_code == 400 and "reload the page" in r.get_json()["error"]
    assert rows(shop, Order) == 0 and on_hand("NB-A5-DOT", shop) == 40


# -- checkout --------------------------------------------------------------------------------------


def test_checking_out_an_empty_cart_is_a_400(shop, browser):
    r = browser.checkout_cart(headers=JSON)
    assert r.status_code == 400 and r.get_json()["error"] == "Your cart is empty."
    assert rows(shop, Order) == 0


def test_checking_out_with_a_bad_email_is_a_400_that_keeps_the_cart(shop, browser):
    browser.add("NB-A5-DOT")
    r = browser.checkout_cart("not-an-email")
    assert r.status_code == 400
    html = r.get_data(as_text=True)
    assert "does not look like an email address" in html and "NB-A5-DOT" in html
    assert rows(shop, Order) == 0 and on_hand("NB-A5-DOT", shop) == 40


def test_checking_out_more_than_is_left_is_a_409_that_re_renders_the_cart_with_the_reason(shop, browser):
    browser.add("MUG-350-NVY", 3)
    browser.add("NB-A6-DOT", 1)
    other = Shopper(shop)
    other.buy("MUG-350-NVY", 2)  # someone else bought two meanwhile
    r = browser.checkout_cart()
    assert r.status_code == 409
    html = r.get_data(as_text=True)
    # The short line is marked where it is, with its fix; the banner says it once.
    assert "MUG-350-NVY" in html and "Only 1 left" in html and "Reduce to 1" in html
    assert html.count("no longer available in the quantity you chose") == 1
    assert "Check out and pay" in html  # the cart is still there to fix
    data = browser.checkout_cart(headers=JSON).get_json()
    assert data["shortages"] == [
        {
            "variant_id": shop.skus["MUG-350-NVY"],
            "sku": "MUG-350-NVY",
            "name": "Enamel Camp Mug – Navy",
            "requested": 3,
            "available": 1,
        }
    ]
    assert rows(shop, Order) == 1
    assert (on_hand("MUG-350-NVY", shop), on_hand("NB-A6-DOT", shop)) == (1, 25)


def test_a_double_submitted_checkout_of_one_cart_creates_one_order(shop, browser):
    browser.add("NB-A5-DOT", 2)
    twin = shop.test_client()  # the same browser, a second tab: same session cookie
    twin.set_cookie("session", browser.client.get_cookie("session").value)
    barrier = threading.Barrier(2)
    answers = []

    def submit(client):
        barrier.wait()
        answers.append(
            client.post("/checkout", headers=JSON, data={"csrf_token": browser.token, "email": "ann@example.com"})
        )

    threads = [threading.Thread(target=submit, args=(c,)) for c in (browser.client, twin)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.status_code for a in answers) == [303, 409], [a.get_json() for a in answers]
    assert rows(shop, Order) == 1 and on_hand("NB-A5-DOT", shop) == 38
    assert rows(shop, Cart, Cart.status == "ordered") == 1
    # The loser, and a later resubmit, point at the order the winner placed
    # (tests/web/test_double_checkout.py follows the link).
    placed = next(a for a in answers if a.status_code == 303).get_json()["reference"]
    assert next(a for a in answers if a.status_code == 409).get_json()["reference"] == placed
    again = browser.checkout_cart(headers=JSON)
    assert again.status_code == 409 and again.get_json()["reference"] == placed
    assert rows(shop, Order) == 1


# -- orders ------------------------------------------------------------------------------------------


def test_the_orders_list_and_the_order_page_have_the_contract_json_shape(shop, browser):
    first = browser.buy("NB-A5-DOT", 2)
    second = browser.buy("MUG-350-SND", 1)
    listing = browser.client.get("/orders", headers=JSON).get_json()
    assert list(listing) == ["orders"]
    assert [o["reference"] for o in listing["orders"]] == [second, first]  # newest first
    for o in listing["orders"]:
        assert set(o) == {"reference", "status", "total", "currency", "created_at"}
        assert o["status"] == "PendingPayment" and ISO.match(o["created_at"])
    assert listing["orders"][1]["total"] == 2800

    data = browser.order(first)
    assert set(data) == {
        "reference",
        "status",
        "version",
        "total",
        "currency",
        "inventory_restored",
        "lines",
        "payment",
        "refunds",
        "refunded",
        "tax",
        "charged",
        "fulfilment",
        "created_at",
        "updated_at",
        "pay_by",
        # Beyond the contract's minimum (docs/REFERENCE.md, Storefront): the decline's words, and
        # whether and where the order ships.
        "last_payment_error",
        "ships",
        "shipping",
    }
    assert (data["last_payment_error"], data["ships"], data["shipping"]) == (None, True, None)
    assert (data["reference"], data["status"], data["version"]) == (first, "PendingPayment", 1)
    assert (data["total"], data["currency"], data["inventory_restored"]) == (2800, "usd", False)
    assert data["payment"] is None and (data["refunds"], data["refunded"]) == ([], 0)
    assert (data["tax"], data["charged"]) == (None, None)  # null until paid
    (line,) = data["lines"]
    assert set(line) >= {"variant_id", "sku", "quantity", "unit_price"}
    assert (line["variant_id"], line["sku"], line["quantity"], line["unit_price"]) == (
        shop.skus["NB-A5-DOT"],
        "NB-A5-DOT",
        2,
        1400,
    )
    for key in ("created_at", "updated_at", "pay_by"):
        assert ISO.match(data[key]), (key, data[key])
    assert data["pay_by"] > data["updated_at"]
    html = browser.client.get(f"/orders/{first}").get_data(as_text=True)
    assert first in html and "$28.00" in html and "Pay now" in html


def _version(app, reference):
    with app.app_context():
        try:
            order = db.session.execute(select(Order).where(Order.reference == reference)).scalar_one()
            return order.status, order.version, order.id
        finally:
            db.session.remove()


@pytest.mark.parametrize("accept", ["json", "html"])
def test_a_stale_version_cancel_gets_409_with_the_current_state_and_changes_nothing(shop, browser, accept):
    reference = browser.buy("MUG-350-NVY", 2)
    status, version, order_id = _version(shop, reference)
    deliveries = rows(shop, OutboxDelivery)  # the checkout's own (the order-placed email)
    with shop.app_context():  # the order moved on after the customer loaded the page
        force_order(order_id, version=Order.version + 1)
    r = browser.cancel(reference, version, headers=JSON if accept == "json" else HTML)
    assert r.status_code == 409
    if accept == "json":
        body = r.get_json()
        assert (body["status"], body["version"]) == ("PendingPayment", version + 1)
        assert "changed since you loaded it" in body["error"]
    else:
        html = r.get_data(as_text=True)
        assert "changed since you loaded it" in html and "Awaiting payment" in html
        # Cancelling again (through the confirm page) now carries the current version.
        assert f'/orders/{reference}/cancel?version={version + 1}"' in html
    assert _version(shop, reference) == ("PendingPayment", version + 1, order_id)
    assert rows(shop, OutboxEvent, OutboxEvent.name == "OrderCancelled") == 0
    assert rows(shop, OutboxDelivery) == deliveries
    assert on_hand("MUG-350-NVY", shop) == 1


def test_a_current_version_cancel_cancels_and_queues_the_stock_restore(shop, browser):
    reference = browser.buy("MUG-350-NVY", 2)
    _, version, order_id = _version(shop, reference)
    r = browser.cancel(reference, version, headers=HTML)
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/orders/{reference}")
    data = browser.order(reference)
    assert (data["status"], data["version"], data["pay_by"]) == ("Cancelled", version + 1, None)
    assert rows(shop, OutboxEvent, OutboxEvent.name == "OrderCancelled", OutboxEvent.order_id == order_id) == 1
    assert (
        rows(
            shop,
            OutboxDelivery,
            OutboxDelivery.handler == "restore_inventory",
            OutboxDelivery.order_id == order_id,
            OutboxDelivery.status == "pending",
        )
        == 1
    )
    again = browser.cancel(reference, version + 1, headers=JSON)
    assert again.status_code == 409 and again.get_json()["status"] == "Cancelled"
    assert rows(shop, OutboxEvent, OutboxEvent.name == "OrderCancelled") == 1


def test_a_browser_that_did_not_place_an_order_cannot_see_or_cancel_it(shop, browser):
    reference = browser.buy("NB-A6-DOT", 1)
    _, version, _ = _version(shop, reference)
    stranger = Shopper(shop)
    assert stranger.get_order(reference).status_code == 404
    assert stranger.client.get(f"/orders/{reference}", headers=HTML).status_code == 404
    assert stranger.cancel(reference, version, headers=HTML).status_code == 404
    assert stranger.cancel(reference, version, headers=HTML, token="wrong-token").status_code == 404
    assert stranger.client.get("/orders", headers=JSON).get_json() == {"orders": []}
    assert stranger.get_order("BK-NOSUCH00").status_code == 404  # indistinguishable from a real one
    assert _version(shop, reference)[:2] == ("PendingPayment", version)


def test_a_url_carrying_the_access_token_shows_the_order_to_any_browser(shop, browser):
    reference = browser.buy("NB-A6-DOT", 1)
    with shop.app_context():
        token = db.session.execute(select(Order.access_token).where(Order.reference == reference)).scalar_one()
        db.session.remove()
    stranger = Shopper(shop)
    r = stranger.get_order(reference, token=token)
    assert r.status_code == 200 and r.get_json()["reference"] == reference
    assert stranger.get_order(reference, token=token[:-1] + ("A" if token[-1] != "A" else "B")).status_code == 404


# -- hostile input: answered in words, never a 500, never another browser's order ---------------


def test_the_return_page_does_not_hand_a_stranger_the_access_token_while_the_provider_is_down(shop, browser):
    """The success URL sends a second device on with the order's token once the session is
    proven to be the order's. With the provider unreachable the order has no session: a stranger
    who knows only the reference gets a 404, and so does the browser that placed it (a session id
    that is not the order's own is never an answer, whoever sends it)."""
    reference = browser.buy("NB-A6-DOT", 1)
    stranger = Shopper(shop)
    r = stranger.client.get(f"/checkout/return?order={reference}&session_id=cs_test_guessed")
    assert r.status_code == 404 and "token=" not in r.headers.get("Location", "")
    assert stranger.get_order(reference).status_code == 404
    mine = browser.client.get(f"/checkout/return?order={reference}&session_id=cs_test_guessed")
    assert mine.status_code == 404 and "Location" not in mine.headers
    assert browser.get_order(reference).status_code == 200


@pytest.mark.parametrize("variant_id", ["2147483648", "99999999999999999999", "-1", "0"])
def test_adding_a_variant_id_that_cannot_exist_is_a_404_or_400_in_words(browser, variant_id):
    r = browser.client.post(
        "/cart/items", headers=JSON, data={"csrf_token": browser.token, "variant_id": variant_id, "quantity": 1}
    )
    assert r.status_code in (400, 404) and r.get_json()["error"]


@pytest.mark.parametrize("reference", ["BK-%00", "BK-%00AAAA", "X" * 300, "BK-ABC%20DEF"])
def test_a_reference_that_cannot_exist_is_a_404_on_every_order_route(browser, reference):
    c, token = browser.client, browser.token
    assert c.get(f"/orders/{reference}", headers=JSON).status_code == 404
    assert (
        c.post(f"/orders/{reference}/cancel", headers=JSON, data={"csrf_token": token, "version": 1}).status_code == 404
    )
    assert c.post(f"/orders/{reference}/pay", headers=JSON, data={"csrf_token": token}).status_code == 404
    # In a query string a NUL is refused as such (400) before any route looks at it.
    assert c.get(f"/checkout/return?order={reference}&session_id=cs_x").status_code in (400, 404)


def test_cancelling_with_a_version_that_is_not_a_number_says_so(shop, browser):
    reference = browser.buy("NB-A6-DOT", 1)
    r = browser.cancel(reference, "seven", headers=JSON)
    assert r.status_code == 400 and "Not a valid integer" in r.get_json()["error"]
    assert _version(shop, reference)[0] == "PendingPayment"


def test_setting_a_cart_lines_quantity_is_checked_like_an_add(shop, browser):
    assert browser.add("MUG-350-NVY", 1).status_code == 303
    variant = shop.skus["MUG-350-NVY"]  # 3 in stock

    def set_to(quantity):
        return browser.client.post(
            f"/cart/items/{variant}/quantity", headers=JSON, data={"csrf_token": browser.token, "quantity": quantity}
        )

    r = set_to(3)
    assert r.status_code == 200 and [i["quantity"] for i in r.get_json()["items"]] == [3]
    r = set_to(4)
    assert r.status_code == 409 and "Only 3 of Enamel Camp Mug – Navy left" in r.get_json()["error"]
    assert set_to("lots").status_code == 400 and set_to(0).status_code == 400
    other = shop.skus["NB-A6-DOT"]  # not in this cart
    assert (
        browser.client.post(
            f"/cart/items/{other}/quantity", headers=JSON, data={"csrf_token": browser.token, "quantity": 1}
        ).status_code
        == 404
    )
    assert [i["quantity"] for i in browser.client.get("/cart", headers=JSON).get_json()["items"]] == [3]
    assert on_hand("MUG-350-NVY", shop) == 3  # a cart holds nothing: only checkout takes stock
