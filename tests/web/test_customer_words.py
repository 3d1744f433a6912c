"""What a customer reads when an order ends: the order page and an email for each final state,
each stating its facts (when the window closed, that nothing was charged, how much was refunded,
when and to what); money in the payment page's format, zero-decimal currencies included."""

from __future__ import annotations

import email
import os
from datetime import timedelta

import pytest

from factories import seed_catalog_rows
from payment_helpers import JSON, Shopper, post_webhook, run_everything, sandbox_event
from shop import emails
from shop.domain.deadlines import utcnow
from shop.money import format_money


@pytest.fixture
def fresh_paying_app(fresh_paying_app, tmp_path):
    """The mail this test's orders get, in a folder of its own (order ids restart every test)."""
    fresh_paying_app.instance_path = str(tmp_path)
    return fresh_paying_app


def _mail(app, ref: str, template: str) -> email.message.Message:
    folder = os.path.join(app.instance_path, "mail")
    found = [f for f in os.listdir(folder) if f.startswith(f"{ref}-{template}-")] if os.path.isdir(folder) else []
    assert len(found) == 1, (template, found)
    with open(os.path.join(folder, found[0]), "rb") as fh:
        return email.message_from_bytes(fh.read())


def _body(message) -> str:
    return message.get_payload(decode=True).decode()


def test_an_order_whose_window_ran_out_says_so_on_its_page_and_in_an_email(fresh_paying_app, sandbox):
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    sandbox.faults(api_unavailable=True)  # the order stays PendingPayment: the customer never pays
    shopper.checkout("NB-A5-DOT", 2)
    sandbox.faults(api_unavailable=False)
    ref = shopper.latest()["reference"]

    run_everything(app, now=utcnow() + timedelta(seconds=app.config["UNPAID_ORDER_EXPIRY_SECONDS"] + 5))

    order = shopper.order(ref)
    assert (order["status"], order["cancelled_because"]) == ("Cancelled", "expired")
    page = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "Expired" in page and "no payment arrived" in page and "Nothing was charged" in page
    assert "Order again" in page
    message = _mail(app, ref, "order_expired")
    assert ref in message["Subject"] and "no payment arrived in time" in message["Subject"]
    body = _body(message)
    assert "Nothing was charged" in body and "back on sale" in body and "UTC" in body
    assert app.config["PUBLIC_BASE_URL"] + "/" in body  # how to order again
    assert not [f for f in os.listdir(os.path.join(app.instance_path, "mail")) if "order_cancelled" in f]


def test_a_customer_cancel_is_confirmed_in_words_and_by_email(fresh_paying_app, sandbox):
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    order = shopper.place()
    ref = order["reference"]
    assert shopper.cancel(ref, order["version"]).status_code == 200

    run_everything(app)

    assert shopper.order(ref)["cancelled_because"] == "customer"
    page = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "You cancelled this order" in page and "back on sale" in page
    body = _body(_mail(app, ref, "order_cancelled"))
    assert "As you asked" in body and "Nothing was charged" in body


def test_a_refund_email_says_how_much_when_and_to_what(fresh_paying_app, sandbox):
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    order = shopper.place()
    ref, sid = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(sid, "async_pending")
    assert shopper.cancel(ref, shopper.order(ref)["version"]).status_code == 200
    sandbox.async_result(sid, "succeeded")
    post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.async_payment_succeeded", sid))

    run_everything(app)

    body = _body(_mail(app, ref, "refund_issued"))
    assert format_money(order["total"], order["currency"]) in body
    assert "to the card or account you paid with" in body and "UTC" in body
    page = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "We refunded " + format_money(order["total"], order["currency"]) in page


def test_a_failed_payment_email_is_not_sent_once_the_order_has_moved_on(fresh_paying_app, sandbox):
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    order = shopper.place()
    ref, sid = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(sid, "async_pending")
    sandbox.async_result(sid, "failed")
    post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.async_payment_failed", sid))
    assert shopper.order(ref)["status"] == "PaymentFailed"
    assert shopper.cancel(ref, shopper.order(ref)["version"]).status_code == 200  # before the email went

    run_everything(app)

    folder = os.path.join(app.instance_path, "mail")
    sent = [f.removeprefix(f"{ref}-") for f in os.listdir(folder) if f.startswith(f"{ref}-")]
    assert [f.split("-")[0] for f in sent] == ["order_cancelled"]


def test_money_reads_as_on_the_payment_page_in_every_currency():
    assert format_money(2800, "usd") == "$28.00"
    assert format_money(1500, "jpy") == "¥1,500"  # zero-decimal: 1500 is ¥1,500, not ¥15.00
    assert format_money(-250, "EUR") == "-€2.50"
    assert format_money(12345, "kwd").endswith("12.345")  # three-decimal
    assert format_money(None, "usd") == "–"


def test_a_shop_in_yen_shows_whole_yen(make_fresh_app):
    app = make_fresh_app()
    seed_catalog_rows(app, currency="jpy")
    page = app.test_client().get("/").get_data(as_text=True)
    assert "¥1,400" in page and "¥1,400.00" not in page and "14.00" not in page
    variants = [v for p in app.test_client().get("/", headers=JSON).get_json()["products"] for v in p["variants"]]
    assert {v["currency"] for v in variants} == {"jpy"}


@pytest.mark.parametrize(
    "reply_to,contact,reach,footer",
    [
        # Replies have somewhere to go: the email says to reply, and names the contact too.
        ("help@shop.example", "https://shop.example/contact", "reply to this email",
         "Questions? Reply to this email, or contact us at https://shop.example/contact."),
        # No Reply-To: never "reply to this email"; the contact instead.
        (None, "help@shop.example", "write to help@shop.example", "Questions? Write to help@shop.example."),
        (None, None, "contact us through http", None),
    ],
)  # fmt: skip
def test_an_email_tells_the_customer_to_reply_only_when_replies_go_somewhere_and_names_the_contact(
    fresh_paying_app, sandbox, reply_to, contact, reach, footer
):
    app = fresh_paying_app
    app.config.update(MAIL_REPLY_TO=reply_to, SHOP_CONTACT=contact)
    try:
        shopper = Shopper(app, seed_catalog_rows(app))
        order = shopper.place()
        ref = order["reference"]
        assert shopper.cancel(ref, order["version"]).status_code == 200
        run_everything(app)
        message = _mail(app, ref, "order_cancelled")
        body = _body(message)
        lines = [line for line in body.splitlines() if line.strip()]
        if footer:
            assert lines[-1] == footer
        else:
            assert not any(line.startswith("Questions?") for line in lines)
        assert ("reply to this email" in body.lower()) == bool(reply_to)
        assert message["Reply-To"] == reply_to
        with app.test_request_context():
            assert emails.reaching_the_shop("http://127.0.0.1/")["reach"].startswith(reach)
        # The storefront's footer names the same contact, and is not there without one.
        page = shopper.client.get("/").get_data(as_text=True)
        if contact:
            assert f'href="{"mailto:" if "@" in contact else ""}{contact}"' in page
        else:
            assert 'class="contact"' not in page
    finally:
        app.config.update(MAIL_REPLY_TO=None, SHOP_CONTACT=None)
