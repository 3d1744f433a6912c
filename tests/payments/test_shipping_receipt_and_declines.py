"""What the customer is asked and told around paying (docs/REFERENCE.md, Storefront): goods that ship
collect a shipping address at the payment page and the order keeps it; the paid email is a
receipt (items, quantities, unit prices, total, address, link; text and HTML); a declined card
says so on the order page. Real database, Redis and the sandbox over HTTP, the real stripe SDK."""

from __future__ import annotations

import email
import os

import pytest
from sqlalchemy import select, update

from factories import seed_catalog_rows
from payment_helpers import HTML, Shopper, live_shop, order_id, post_webhook, stripe_event
from shop.extensions import db
from shop.models import Order, OutboxDelivery, Product, WebhookReceipt
from shop.outbox.dispatch import run_delivery
from support import log_in, wait_until

ADDRESS = {
    "name": "Grace Hopper",
    "line1": "1 Navy Yard",
    "line2": "Building 4",
    "city": "Arlington",
    "postal_code": "22202",
    "state": "VA",
    "country": "US",
}
SHIPPED = {
    "name": "Grace Hopper",
    "address": {
        "line1": "1 Navy Yard",
        "line2": "Building 4",
        "city": "Arlington",
        "postal_code": "22202",
        "state": "VA",
        "country": "US",
    },
}


def _session(sandbox, session_id: str):
    with sandbox.sandbox.lock:
        return sandbox.sandbox.sessions[session_id]


def _make_digital(app, slug: str = "field-notebook") -> None:
    with app.app_context():
        db.session.execute(update(Product).where(Product.slug == slug).values(ships=False))
        db.session.commit()
        db.session.remove()


def _order_row(app, ref: str) -> Order:
    with app.app_context():
        row = db.session.execute(select(Order).where(Order.reference == ref)).scalar_one()
        db.session.expunge(row)
        db.session.remove()
        return row


@pytest.fixture
def mail_app(make_fresh_app, sandbox, monkeypatch, tmp_path):
    """A paying app whose instance folder (where mail is written without SMTP) is this test's own."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60, STRIPE_WEBHOOK_SECRET="whsec_test_secret"
    )
    app.skus = seed_catalog_rows(app)
    return app


def _paid_by_return(app, sandbox, sku="NB-A5-DOT", quantity=2, **outcome) -> tuple[Shopper, dict]:
    """A customer who checked out, paid at the sandbox (the webhook lost), and came back."""
    shopper = Shopper(app, app.skus)
    order = shopper.place(sku, quantity)
    sid = order["payment"]["session_id"]
    sandbox.faults(drop_webhooks=1)
    sandbox.set_outcome(sid, "paid", **outcome)
    assert shopper.come_back(order["reference"], sid).status_code == 303
    return shopper, shopper.order(order["reference"])


def _receipt(app, ref: str) -> email.message.Message:
    with app.app_context():
        oid = order_id(app, ref)
        [delivery] = db.session.execute(
            select(OutboxDelivery.id).where(
                OutboxDelivery.order_id == oid, OutboxDelivery.handler == "send_order_confirmation"
            )
        ).scalars()
        db.session.remove()
        assert run_delivery(delivery) == "done"
        db.session.remove()
    folder = os.path.join(app.instance_path, "mail")
    [name] = [n for n in os.listdir(folder) if n == f"{ref}-order_paid-event.eml"]
    with open(os.path.join(folder, name), "rb") as fh:
        return email.message_from_binary_file(fh)


def _parts(message) -> dict[str, str]:
    assert message.get_content_type() == "multipart/alternative"
    return {part.get_content_type(): part.get_payload(decode=True).decode() for part in message.get_payload()}


# -- a) the shipping address --------------------------------------------------------------------


def test_a_checkout_of_goods_that_ship_asks_the_payment_page_for_an_address_in_the_shipping_countries(
    fresh_paying_app, shopper, sandbox
):
    order = shopper.place("MUG-350-SND")

    session = _session(sandbox, order["payment"]["session_id"])
    assert session.shipping_countries == list(fresh_paying_app.config["SHIPPING_COUNTRIES"])
    assert "US" in session.shipping_countries
    assert (order["ships"], order["shipping"]) == (True, None)
    assert _order_row(fresh_paying_app, order["reference"]).ships is True


def test_a_cart_of_digital_goods_only_asks_for_no_address_and_a_mixed_cart_does(fresh_paying_app, shopper, sandbox):
    _make_digital(fresh_paying_app)
    digital = shopper.place("NB-A5-DOT")
    assert _session(sandbox, digital["payment"]["session_id"]).shipping_countries is None
    assert digital["ships"] is False

    shopper.add("NB-A6-DOT")
    mixed = shopper.place("SOCK-M")
    assert _session(sandbox, mixed["payment"]["session_id"]).shipping_countries
    assert mixed["ships"] is True


def test_shipping_countries_come_from_the_setting(make_fresh_app, sandbox, monkeypatch):
    monkeypatch.setenv("SHIPPING_COUNTRIES", "ie, gb")
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60)
    order = Shopper(app, seed_catalog_rows(app)).place()
    assert _session(sandbox, order["payment"]["session_id"]).shipping_countries == ["IE", "GB"]


def test_the_address_given_at_the_payment_page_reaches_the_order_by_webhook_for_customer_and_operator(
    make_fresh_app, sandbox
):
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        order = shopper.place()
        sandbox.set_outcome(order["payment"]["session_id"], "paid", shipping_address=ADDRESS)

        paid = wait_until(
            lambda: (lambda o: o if o["status"] == "Paid" else None)(shopper.order(order["reference"])),
            what="the order to be paid",
        )
        assert paid["shipping"] == SHIPPED
        [receipt] = [r for r in _rows(app) if r.event_type == "checkout.session.completed"]
        assert receipt.outcome == "accepted"

        page = shopper.client.get(f"/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
        assert "Shipping to" in page and "Grace Hopper" in page and "1 Navy Yard" in page
        assert "22202 Arlington, VA" in page and "email you again when they ship to the address below" in page

        operator = app.test_client()
        log_in(app, operator)
        console = operator.get(f"/console/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
        assert "<h2>Shipping</h2>" in console and "Grace Hopper" in console and "Building 4" in console
        assert (
            operator.get(f"/console/orders/{order['reference']}", headers={"Accept": "application/json"}).get_json()[
                "order"
            ]["shipping"]
            == SHIPPED
        )


def _rows(app) -> list[WebhookReceipt]:
    with app.app_context():
        rows = db.session.execute(select(WebhookReceipt).order_by(WebhookReceipt.id)).scalars().all()
        db.session.expunge_all()
        db.session.remove()
        return rows


def test_the_return_page_keeps_the_address_when_the_webhook_was_lost(mail_app, sandbox):
    _shopper, paid = _paid_by_return(mail_app, sandbox, shipping_address=ADDRESS)
    assert paid["status"] == "Paid" and paid["shipping"] == SHIPPED


def test_an_unpaid_order_of_goods_shows_the_operator_where_the_address_will_come_from(fresh_paying_app, shopper):
    order = shopper.place()
    operator = fresh_paying_app.test_client()
    log_in(fresh_paying_app, operator)
    console = operator.get(f"/console/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
    assert "the customer gives the shipping address at the payment page" in console


# -- b) the receipt -----------------------------------------------------------------------------


def test_the_paid_email_is_a_receipt_in_text_and_html_with_items_total_address_and_link(mail_app, sandbox):
    _shopper, paid = _paid_by_return(mail_app, sandbox, "NB-A5-DOT", 2, shipping_address=ADDRESS)
    ref = paid["reference"]
    message = _receipt(mail_app, ref)

    assert message["Subject"] == f"Your receipt for order {ref}"
    parts = _parts(message)
    assert list(parts) == ["text/plain", "text/html"]  # the preferred part last (RFC 2046)
    text, html = parts["text/plain"], parts["text/html"]
    assert "2 × Field Notebook – A5, dot grid (NB-A5-DOT) at $14.00 each: $28.00" in text
    assert "Total paid: $28.00" in text
    assert "Shipping to:\n  Grace Hopper\n  1 Navy Yard\n  Building 4\n  22202 Arlington, VA\n  US\n" in text
    assert f"/orders/{ref}?token=" in text
    for fact in ("Field Notebook – A5, dot grid", ">2<", "$14.00", "$28.00", "Grace Hopper", "22202 Arlington, VA"):
        assert fact in html, fact
    assert f"/orders/{ref}?token=" in html and '<html lang="en">' in html


def test_a_digital_orders_receipt_says_there_is_nothing_to_ship(mail_app, sandbox):
    _make_digital(mail_app)
    _shopper, paid = _paid_by_return(mail_app, sandbox, "NB-A6-DOT", 1)
    assert paid["shipping"] is None
    text, html = _parts(_receipt(mail_app, paid["reference"])).values()

    assert "1 × Field Notebook – A6, dot grid (NB-A6-DOT) at $11.00 each: $11.00" in text
    assert "nothing to ship" in text and "nothing to ship" in html and "Shipping to" not in text


# -- c) a declined card -------------------------------------------------------------------------


def test_a_declined_card_says_so_on_the_order_page_with_a_way_to_try_again(make_fresh_app, sandbox):
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        order = shopper.place()
        ref, sid = order["reference"], order["payment"]["session_id"]
        sandbox.set_outcome(sid, "declined")

        declined = wait_until(
            lambda: (lambda o: o if o["payment"]["status"] == "declined" else None)(shopper.order(ref)),
            what="the decline to reach the order",
        )
        assert declined["status"] == "PaymentInitiated" and declined["version"] == order["version"]
        assert declined["last_payment_error"] == "Your card was declined."
        page = shopper.client.get(f"/orders/{ref}", headers=HTML).get_data(as_text=True)
        assert "Your card was declined." in page and "Card declined" in page
        assert f'href="{order["payment"]["url"]}">Continue to payment' in page

        # The customer tries again on the same page, and pays: the decline is no longer news.
        sandbox.set_outcome(sid, "paid")
        paid = wait_until(
            lambda: (lambda o: o if o["status"] == "Paid" else None)(shopper.order(ref)), what="the order paid"
        )
        assert paid["last_payment_error"] is None and paid["payment"]["status"] == "paid"


def test_a_decline_of_an_attempt_the_order_has_left_is_old_news(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    failure = {
        "id": "pi_test_old",
        "object": "payment_intent",
        "metadata": {"order_id": str(order_id(fresh_paying_app, order["reference"])), "attempt": "7"},
        "last_payment_error": {"type": "card_error", "code": "card_declined", "message": "Your card was declined."},
    }
    answer = post_webhook(fresh_paying_app.test_client(), stripe_event("payment_intent.payment_failed", failure))

    assert answer.status_code == 200 and answer.get_json()["outcome"] == "old_news"
    after = shopper.order(order["reference"])
    assert after["payment"]["status"] == "open" and after["last_payment_error"] is None


def test_a_decline_names_the_cards_problem_in_the_customers_words(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    failure = {
        "id": "pi_test_funds",
        "object": "payment_intent",
        "metadata": {"order_id": str(order_id(fresh_paying_app, order["reference"])), "attempt": "1"},
        "last_payment_error": {"code": "card_declined", "decline_code": "insufficient_funds", "message": "x"},
    }
    client = fresh_paying_app.test_client()
    assert post_webhook(client, stripe_event("payment_intent.payment_failed", failure)).get_json()["outcome"] == (
        "declined"
    )
    # A redelivery notes the same words again: nothing else changes.
    assert post_webhook(client, stripe_event("payment_intent.payment_failed", failure, "evt_2")).status_code == 200
    after = shopper.order(order["reference"])
    assert after["last_payment_error"] == "Your card was declined: it has insufficient funds."
    assert (after["status"], after["version"]) == ("PaymentInitiated", order["version"])


def test_a_failed_payment_shows_its_words_and_pay_now(make_fresh_app, sandbox):
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        order = shopper.place()
        sid = order["payment"]["session_id"]
        sandbox.set_outcome(sid, "async_pending")
        sandbox.async_result(sid, "failed")
        failed = wait_until(
            lambda: (lambda o: o if o["status"] == "PaymentFailed" else None)(shopper.order(order["reference"])),
            what="the order to fail",
        )
        assert failed["last_payment_error"] == "Your payment did not go through."
        page = shopper.client.get(f"/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
        assert 'role="alert"><strong>Your payment did not go through.</strong>' in page
        assert ">Pay now</button>" in page


@pytest.mark.parametrize(
    "metadata",
    [{}, {"order_id": "not-a-number"}, {"order_id": "99999999999999"}, {"order_id": "424242", "attempt": "x"}],
)
def test_a_payment_failure_naming_no_known_order_is_answered_and_recorded(fresh_paying_app, metadata):
    failure = {"id": "pi_test_odd", "object": "payment_intent", "metadata": metadata, "last_payment_error": "odd"}
    client = fresh_paying_app.test_client()
    answer = post_webhook(client, stripe_event("payment_intent.payment_failed", failure))

    assert answer.status_code == 200 and answer.get_json()["outcome"] == "unknown_order"
    [receipt] = _rows(fresh_paying_app)
    assert (receipt.event_type, receipt.outcome) == ("payment_intent.payment_failed", "accepted")


@pytest.mark.parametrize(
    ("value", "words"),
    [("USA", "got USA"), ("US,,1X", "got 1X"), (" , ", "got ' , '")],
)
def test_a_bad_shipping_countries_setting_stops_the_app_naming_it(tmp_path, value, words):
    from shop.settings import SettingsError, load_settings

    with pytest.raises(SettingsError) as stopped:
        load_settings({"SHIPPING_COUNTRIES": value, "SECRET_KEY": "x"}, str(tmp_path))
    assert stopped.value.variable == "SHIPPING_COUNTRIES" and words in str(stopped.value)
