"""Where a checkout refused by UNPAID_ORDERS_PER_CLIENT leads (docs/REFERENCE.md, Storefront):
the refusal says whose orders filled the limit; this browser's are a link away ("Your orders"),
an address's placed from another browser are never shown, only their private links emailed to
the address on request (POST /orders/links) when they cannot be released, with one answer whether or not the address has
such orders, and a few requests an hour per address."""

from __future__ import annotations

import email
import os

import pytest
from sqlalchemy import select

from payment_helpers import HTML, JSON, Shopper
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import ScheduledCommand
from shop.outbox.dispatch import run_command


@pytest.fixture
def shop(make_shop, monkeypatch, tmp_path):
    """The shop with a limit of 3, on the sandbox (no webhook reaches it), writing its mail under
    this test's own instance folder."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    return make_shop(sandbox=True, UNPAID_ORDERS_PER_CLIENT=3, MAX_LINE_QUANTITY=10)


def _order_link_commands(app) -> list[ScheduledCommand]:
    with app.app_context():
        rows = (
            db.session.execute(
                select(ScheduledCommand)
                .where(ScheduledCommand.kind == "send_email")
                .where(ScheduledCommand.payload["template"].as_string() == "order_link")
                .order_by(ScheduledCommand.id)
            )
            .scalars()
            .all()
        )
        db.session.expunge_all()
        db.session.remove()
        return rows


def _send(app) -> list[email.message.Message]:
    """Run the order_link emails due, and read what the mailer wrote."""
    for command in _order_link_commands(app):
        with app.app_context():
            run_command(command.id, now=utcnow())
            db.session.remove()
    folder = os.path.join(app.instance_path, "mail")
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if "order_link" in name:
            with open(os.path.join(folder, name), "rb") as fh:
                found.append(email.message_from_binary_file(fh))
    return found


def _fill_the_address(app, sandbox, address: str) -> list[str]:
    """Three orders for `address`, each from a browser of its own (not the test's), each paid at
    the provider with the news not here yet: a checkout of the address cannot release them
    (orders.release: a paid session refuses the cancel), so it is refused."""
    references = []
    for _ in range(3):
        shopper = Shopper(app)
        assert shopper.checkout("NB-A6-DOT", 1, email=address).status_code == 303
        order = shopper.latest()
        sandbox.set_outcome(order["payment"]["session_id"], "paid")
        references.append(order["reference"])
    return references


def test_a_browser_at_the_limit_is_told_it_is_this_browsers_orders_with_a_link_to_them(shop, browser):
    for i in range(3):
        browser.buy("NB-A5-DOT", 1, email=f"me{i}@example.com")
    assert browser.add("NB-A5-DOT", 1).status_code == 303

    r = browser.checkout_cart("fresh@example.com", headers=JSON)
    assert r.status_code == 409
    assert r.get_json()["unpaid_limit"] == {"held_by": "browser", "limit": 3, "orders_url": "/orders"}

    page = browser.checkout_cart("fresh@example.com").get_data(as_text=True)
    assert "This browser already has 3 orders waiting for payment." in page
    assert '(<a href="/orders">Your orders</a>)' in page
    assert "/orders/links" not in page  # nothing to email: they are this browser's own


def test_an_address_filled_from_other_browsers_is_named_and_offered_its_links_not_its_orders(shop, sandbox, browser):
    references = _fill_the_address(shop, sandbox, "bea@example.com")
    assert browser.add("NB-A5-DOT", 1).status_code == 303

    r = browser.checkout_cart("Bea@Example.com", headers=JSON)
    assert r.status_code == 409
    data = r.get_json()
    assert data["unpaid_limit"] == {
        "held_by": "address",
        "limit": 3,
        "email": "Bea@Example.com",
        "links_url": "/orders/links",
    }
    assert data["error"].startswith("The address Bea@Example.com already has 3 orders waiting for payment")

    page = browser.checkout_cart("Bea@Example.com").get_data(as_text=True)
    assert '<form method="post" action="/orders/links">' in page
    assert "Email the links to Bea@Example.com" in page
    assert not any(ref in page for ref in references)
    assert browser.client.get("/orders", headers=JSON).get_json()["orders"] == []


def test_asking_for_the_links_emails_each_waiting_order_of_the_address_its_private_link(shop, sandbox, browser):
    references = _fill_the_address(shop, sandbox, "cy@example.com")
    stranger_order = Shopper(shop).buy("NB-A6-DOT", 1, email="someone.else@example.com")

    r = browser.post("/orders/links", email="CY@example.com")

    assert r.status_code == 303 and r.headers["Location"] == "/cart"
    cart = browser.cart_page()
    assert "If CY@example.com has orders waiting for payment, we have emailed their links to it." in cart
    assert not any(ref in cart for ref in references)
    mails = _send(shop)
    assert sorted(m["Subject"] for m in mails) == sorted(
        f"Your order {ref} is waiting for payment" for ref in references
    )
    assert {m["To"] for m in mails} == {"cy@example.com"}
    for message in mails:
        body = message.get_payload(decode=True).decode()
        ref = message["Subject"].split()[2]
        link = next(line for line in body.splitlines() if f"/orders/{ref}?token=" in line).strip()
        token = link.split("token=", 1)[1]
        assert Shopper(shop).get_order(ref, token=token).get_json()["reference"] == ref
        assert stranger_order not in body


def test_the_answer_is_the_same_for_an_address_without_orders_and_nothing_is_sent(shop, sandbox, browser):
    _fill_the_address(shop, sandbox, "dee@example.com")

    with_orders = browser.post("/orders/links", headers=JSON, email="dee@example.com")
    without = browser.post("/orders/links", headers=JSON, email="nobody@example.com")

    assert with_orders.status_code == without.status_code == 202
    said = with_orders.get_json()["message"].replace("dee@example.com", "@")
    assert said == without.get_json()["message"].replace("nobody@example.com", "@")
    assert len(_order_link_commands(shop)) == 3  # dee's three only


def test_an_order_no_longer_waiting_when_its_link_email_runs_is_not_sent(shop):
    owner = Shopper(shop)
    assert owner.checkout("NB-A6-DOT", 1, email="eve@example.com").status_code == 303
    ref = owner.latest()["reference"]
    assert Shopper(shop).post("/orders/links", email="eve@example.com").status_code == 303
    assert owner.cancel(ref, owner.order(ref)["version"]).status_code == 200

    assert _send(shop) == []


def test_the_links_of_one_address_are_sent_at_most_three_times_an_hour(shop, browser):
    for _ in range(3):
        assert browser.post("/orders/links", headers=JSON, email="fay@example.com").status_code == 202

    r = browser.post("/orders/links", headers=JSON, email="FAY@example.com")

    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
    assert r.get_json()["error"].startswith("Too many requests for this address's links; try again in")
    assert browser.post("/orders/links", headers=HTML, email="gus@example.com").status_code == 303


def test_the_links_form_wants_an_address(shop, browser):
    r = browser.post("/orders/links", headers=JSON, email="not an address")
    assert r.status_code == 400 and r.get_json()["error"] == "That does not look like an email address."
    assert _order_link_commands(shop) == []
