"""The console's refund, email-resend and stock-correction pages over HTTP: behind the operator's
login and CSRF, confirmed before the money moves, once per submission, and in the audit trail."""

from __future__ import annotations

import re

import pytest

from factories import catalog_rows, on_hand, seed_catalog_rows
from payment_helpers import Shopper, place_and_pay, run_everything
from shop.extensions import db
from shop.models import EmailResend, OperatorAction, Order, Refund, ScheduledCommand, StockCorrection
from support import csrf_token, log_in, mails, rows_in

HTML, JSON = {"Accept": "text/html"}, {"Accept": "application/json"}
KEY = re.compile(r'name="request_key" value="([^"]+)"')


@pytest.fixture
def paid_order(mail_folder, make_fresh_app, sandbox):
    """A logged-in client and a paid order of 2 x SOCK-M with its confirmation sent:
    (app, client, csrf token, reference, order id, total, sock variant id)."""
    app, oid, total, skus = place_and_pay(make_fresh_app, sandbox, "SOCK-M", 2)
    run_everything(app)
    client = app.test_client()
    token = log_in(app, client)
    with app.app_context():
        reference = db.session.get(Order, oid).reference
        db.session.remove()
    return app, client, token, reference, oid, total, skus["SOCK-M"]


def test_the_new_pages_and_actions_are_behind_the_operators_login(fresh_app, fresh_client):
    anonymous = csrf_token(fresh_client, "/console/login")
    for url in (
        "/console/orders/X/refund",
        "/console/orders/X/emails",
        "/console/orders/X/emails/resend?template=order_paid",
        "/console/inventory",
        "/console/inventory/1",
    ):
        assert fresh_client.get(url, headers=HTML).headers["Location"].startswith("/console/login"), url
        assert fresh_client.get(url, headers=JSON).status_code == 401, url
    for url in ("/console/orders/X/refund", "/console/orders/X/emails/resend", "/console/inventory/1/adjust"):
        r = fresh_client.post(url, data={"csrf_token": anonymous}, headers=HTML)
        assert r.status_code == 302 and r.headers["Location"].startswith("/console/login"), url
        assert fresh_client.post(url, data={}, headers=JSON).status_code == 401, url


def test_a_refund_is_asked_confirmed_then_made_once_however_often_the_confirmation_is_posted(paid_order, sandbox):
    app, client, token, ref, oid, total, sock = paid_order
    form = client.get(f"/console/orders/{ref}/refund")
    assert form.status_code == 200 and "Review the refund" in form.get_data(as_text=True)
    # A mistake on the form is said in words, beside the form, and nothing moves.
    too_much = client.get(f"/console/orders/{ref}/refund", query_string={"amount": "9999", "reason": "x"})
    assert too_much.status_code == 400 and "more than is left to refund" in too_much.get_data(as_text=True)
    bad = client.get(f"/console/orders/{ref}/refund", query_string={"amount": "1.234", "reason": "x"})
    assert bad.status_code == 400 and "2 decimal places at most" in bad.get_data(as_text=True)
    confirm = client.get(
        f"/console/orders/{ref}/refund", query_string={"amount": "1.50", "reason": "one sock torn", "restock": "1"}
    )
    page = confirm.get_data(as_text=True)
    assert confirm.status_code == 200 and "Yes, refund $1.50" in page
    assert rows_in(app, Refund) == []  # the confirmation step moved no money
    key = KEY.search(page).group(1)
    before = on_hand(sock, app)
    assert 'name="amount" value="150"' in page  # posted in the currency's smallest unit
    data = {"csrf_token": token, "request_key": key, "amount": "150", "reason": "one sock torn", "restock": "yes"}
    first = client.post(f"/console/orders/{ref}/refund", data=data)
    assert first.status_code == 303 and first.headers["Location"].endswith(f"/console/orders/{ref}")
    again = client.post(f"/console/orders/{ref}/refund", data=data, headers=JSON)
    assert again.status_code == 200 and again.get_json()["already"] is True
    [refund] = rows_in(app, Refund, order_id=oid)
    assert (refund.amount, refund.requested_by, refund.restock, refund.reason) == (
        150,
        "night-shift@example.com",
        True,
        "one sock torn",
    )
    assert on_hand(sock, app) == before + 2
    run_everything(app)
    assert rows_in(app, Refund, order_id=oid)[0].status == "succeeded"
    # The order page, its JSON and the refunds list show it; the audit trail has both posts.
    detail = client.get(f"/console/orders/{ref}", headers=JSON).get_json()
    assert [(r["amount"], r["requested_by"], r["restock"]) for r in detail["refunds"]] == [
        (150, "night-shift@example.com", True)
    ]
    assert any(
        t["kind"] == "refund" and t["what"] == "refund by night-shift@example.com" and "stock put back" in t["detail"]
        for t in detail["timeline"]
    )
    # The customer's page says what it is, not "already paid" (a second payment's words).
    token_of_order = rows_in(app, Order, id=oid)[0].access_token
    customer = app.test_client().get(f"/orders/{ref}", query_string={"token": token_of_order}).get_data(as_text=True)
    assert "a refund our team made on this order" in customer and "already paid" not in customer
    listed = client.get("/console/refunds", headers=JSON).get_json()["refunds"]
    assert [(r["order_reference"], r["amount"]) for r in listed] == [(ref, 150)]
    audit = [(a.action, a.status, a.reason, a.order_id) for a in rows_in(app, OperatorAction)]
    assert audit == [("refund", 303, "one sock torn", oid), ("refund", 200, "one sock torn", oid)]


def test_a_refund_post_without_the_csrf_token_is_refused_and_moves_no_money(paid_order):
    app, client, token, ref, oid, *_ = paid_order
    data = {"request_key": "k" * 32, "amount": "100", "reason": "no token"}
    r = client.post(f"/console/orders/{ref}/refund", data=data, headers=JSON)
    assert r.status_code == 400
    assert rows_in(app, Refund) == []


def test_a_refund_over_what_is_left_is_refused_in_words_when_posted(paid_order):
    app, client, token, ref, oid, total, _ = paid_order
    data = {"csrf_token": token, "request_key": "k" * 32, "amount": str(total + 1), "reason": "too much"}
    r = client.post(f"/console/orders/{ref}/refund", data=data, headers=JSON)
    assert r.status_code == 400 and "more than is left to refund" in r.get_json()["error"]
    assert r.get_json()["why"] == "over_refundable"
    assert rows_in(app, Refund) == []
    assert [(a.action, a.status) for a in rows_in(app, OperatorAction)] == [("refund", 400)]


def test_a_refund_of_an_unpaid_order_is_refused_on_the_page_and_when_posted(mail_folder, fresh_paying_app, sandbox):
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    ref = shopper.place("SOCK-M", 1)["reference"]
    client = app.test_client()
    token = log_in(app, client)
    page = client.get(f"/console/orders/{ref}/refund")
    assert page.status_code == 409 and "Only a paid order can be refunded" in page.get_data(as_text=True)
    data = {"csrf_token": token, "request_key": "k" * 32, "amount": "100", "reason": "why not"}
    r = client.post(f"/console/orders/{ref}/refund", data=data, headers=JSON)
    assert r.status_code == 409 and r.get_json()["why"] == "not_paid"


def test_an_email_the_order_was_sent_is_sent_again_once_per_click(paid_order, mail_folder):
    app, client, token, ref, oid, *_ = paid_order
    assert len(mails(mail_folder, "order_paid")) == 1
    listed = client.get(f"/console/orders/{ref}/emails", headers=JSON).get_json()
    assert [e["template"] for e in listed["emails"]] == ["order_paid"]
    page = client.get(f"/console/orders/{ref}/emails").get_data(as_text=True)
    assert f"/console/orders/{ref}/emails/resend?template=order_paid" in page
    # The confirmation step says what goes where, and sends nothing.
    confirm = client.get(f"/console/orders/{ref}/emails/resend?template=order_paid")
    text = confirm.get_data(as_text=True)
    assert confirm.status_code == 200 and "Send the Order confirmation (paid) email again?" in text
    assert rows_in(app, EmailResend, order_id=oid) == []
    asked = client.get(f"/console/orders/{ref}/emails/resend?template=order_paid", headers=JSON).get_json()
    assert (asked["step"], asked["template"], asked["times_sent"]) == ("confirm", "order_paid", 1)
    assert asked["email"] and f"It goes to {asked['email']}" in text
    never = client.get(f"/console/orders/{ref}/emails/resend?template=refund_failed", headers=JSON)
    assert never.status_code == 409 and never.get_json()["why"] == "not_sent"
    unknown = client.get(f"/console/orders/{ref}/emails/resend?template=spam", headers=JSON)
    assert unknown.status_code == 400 and "order_paid" in unknown.get_json()["error"]
    key = KEY.search(text).group(1)
    data = {"csrf_token": token, "template": "order_paid", "request_key": key}
    assert client.post(f"/console/orders/{ref}/emails/resend", data=data).status_code == 303
    assert client.post(f"/console/orders/{ref}/emails/resend", data=data, headers=JSON).get_json()["already"] is True
    [resend] = rows_in(app, EmailResend, order_id=oid)
    assert (resend.template, resend.operator) == ("order_paid", "night-shift@example.com")
    run_everything(app)
    assert len(mails(mail_folder, "order_paid")) == 2
    [command] = rows_in(app, ScheduledCommand, id=resend.command_id)
    assert command.status == "done"
    # The resent email is listed too, with who sent it.
    emails = client.get(f"/console/orders/{ref}/emails", headers=JSON).get_json()["emails"]
    assert [e["resent_by"] for e in emails] == [None, "night-shift@example.com"]
    # An email the order never had is refused in words.
    other = {"csrf_token": token, "template": "refund_failed", "request_key": "x" * 32}
    r = client.post(f"/console/orders/{ref}/emails/resend", data=other, headers=JSON)
    assert r.status_code == 409 and "never sent" in r.get_json()["error"]
    audit = [(a.action, a.status) for a in rows_in(app, OperatorAction)]
    assert audit == [("resend_email", 303), ("resend_email", 200), ("resend_email", 409)]


def test_stock_is_corrected_from_its_page_with_a_reason_and_shows_in_its_history(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(10)
    client = fresh_app.test_client()
    token = log_in(fresh_app, client)
    page = client.get(f"/console/inventory/{variant}").get_data(as_text=True)
    key = KEY.search(page).group(1)
    url = f"/console/inventory/{variant}/adjust"
    data = {"csrf_token": token, "on_hand": "7", "seen": "10", "reason": "shelf count", "request_key": key}
    assert client.post(url, data=data).status_code == 303
    again = client.post(url, data=data, headers=JSON)
    assert again.get_json()["already"] is True and again.get_json()["on_hand"] == 7
    # A count set against a count that is no longer the stock is refused, saying the count now.
    stale = {**data, "on_hand": "5", "request_key": "s" * 32}
    r = client.post(url, data=stale, headers=JSON)
    assert r.status_code == 409 and "it is 7 now, not 10" in r.get_json()["error"]
    no_reason = {"csrf_token": token, "delta": "+2", "reason": " "}
    assert client.post(url, data=no_reason, headers=JSON).status_code == 400
    not_number = {"csrf_token": token, "delta": "two", "reason": "shelf count"}
    r = client.post(url, data=not_number, headers=JSON)
    assert r.status_code == 400 and "whole number" in r.get_json()["error"]
    both = {"csrf_token": token, "delta": "1", "on_hand": "3", "reason": "shelf count"}
    r = client.post(url, data=both, headers=JSON)
    assert r.status_code == 400 and "not both" in r.get_json()["error"]
    # A script's delta without a request key: the same submission twice adjusts once.
    script = {"csrf_token": token, "delta": "-2", "reason": "two broken in the van"}
    first = client.post(url, data=script, headers=JSON).get_json()
    second = client.post(url, data=script, headers=JSON).get_json()
    assert (first["old"], first["new"], first["already"], second["already"]) == (7, 5, False, True)
    history = client.get(f"/console/inventory/{variant}", headers=JSON).get_json()
    assert history["on_hand"] == 5
    assert [(c["operator"], c["old"], c["new"], c["delta"], c["reason"]) for c in history["corrections"]] == [
        ("night-shift@example.com", 7, 5, -2, "two broken in the van"),
        ("night-shift@example.com", 10, 7, -3, "shelf count"),
    ]
    assert [c.new_on_hand for c in rows_in(fresh_app, StockCorrection)] == [7, 5]
    audit = [(a.action, a.status, a.reason) for a in rows_in(fresh_app, OperatorAction)]
    assert audit == [
        ("adjust_inventory", 303, "shelf count"),
        ("adjust_inventory", 200, "shelf count"),
        ("adjust_inventory", 409, "shelf count"),
        ("adjust_inventory", 400, None),
        ("adjust_inventory", 400, "shelf count"),
        ("adjust_inventory", 400, "shelf count"),
        ("adjust_inventory", 200, "two broken in the van"),
        ("adjust_inventory", 200, "two broken in the van"),
    ]


def test_a_scripted_refund_in_minor_units_without_an_amount_refunds_the_rest_once(paid_order):
    app, client, token, ref, oid, total, sock = paid_order
    part = {"csrf_token": token, "amount": "400", "reason": "late delivery", "restock": "no"}
    assert client.post(f"/console/orders/{ref}/refund", data=part, headers=JSON).get_json()["refundable"] == total - 400
    # No request key: the same submission sent again is the same refund.
    assert client.post(f"/console/orders/{ref}/refund", data=part, headers=JSON).get_json()["already"] is True
    rest = {"csrf_token": token, "reason": "customer returned everything", "restock": "yes"}
    answer = client.post(f"/console/orders/{ref}/refund", data=rest, headers=JSON).get_json()
    assert (answer["amount"], answer["refundable"], answer["restocked"]) == (total - 400, 0, True)
    assert [r.amount for r in rows_in(app, Refund, order_id=oid)] == [400, total - 400]
    wrong = [
        ({"amount": "1.50"}, "smallest unit"),
        ({"restock": "maybe"}, "restock must be yes or no"),
    ]
    for extra, words in wrong:
        r = client.post(f"/console/orders/{ref}/refund", data={**part, **extra}, headers=JSON)
        assert r.status_code == 400 and words in r.get_json()["error"], extra
    nothing = client.post(f"/console/orders/{ref}/refund", data={**rest, "reason": "again"}, headers=JSON)
    assert nothing.status_code == 409 and nothing.get_json()["why"] == "nothing_left"


def test_the_order_page_and_the_restore_warnings_lead_to_the_stock_page(paid_order):
    app, client, token, ref, oid, total, sock = paid_order
    page = client.get(f"/console/orders/{ref}").get_data(as_text=True)
    assert f'href="/console/inventory/{sock}"' in page
    assert f'href="/console/orders/{ref}/refund"' in page and f'href="/console/orders/{ref}/emails"' in page
    warnings = client.get("/console/restore-warnings").get_data(as_text=True)
    assert 'href="/console/inventory"' in warnings
