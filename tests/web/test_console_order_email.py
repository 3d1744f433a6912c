"""An order's address in the console over HTTP (docs/REFERENCE.md, Console): an operator changes
it (the new one checked as the checkout checks it, the old and the new in the audit trail) or sends
one of the order's emails to another address, the order keeping its own; both behind the
operator's login and in the audit trail."""

from __future__ import annotations

import re

import pytest

from payment_helpers import paid_with_operator, run_everything
from shop.extensions import db
from shop.models import OperatorAction, Order
from support import csrf_token, mails

HTML, JSON = {"Accept": "text/html"}, {"Accept": "application/json"}
KEY = re.compile(r'name="request_key" value="([^"]+)"')


@pytest.fixture
def paid_order(mail_folder, make_fresh_app, sandbox):
    """A logged-in client and a paid order with its confirmation sent: (app, client, csrf token,
    reference, order id, the order's address)."""
    paid = paid_with_operator(make_fresh_app, sandbox, "SOCK-M", 1)
    return paid.app, paid.client, paid.token, paid.reference, paid.oid, paid.email


def _email_of(app, oid: int) -> str:
    with app.app_context():
        try:
            return db.session.get(Order, oid).email
        finally:
            db.session.remove()


def _audit(app) -> list[OperatorAction]:
    with app.app_context():
        rows = db.session.query(OperatorAction).order_by(OperatorAction.id).all()
        db.session.expunge_all()
        db.session.remove()
        return rows


def _resend(client, token, ref, **form):
    page = client.get(f"/console/orders/{ref}/emails/resend?template=order_paid").get_data(as_text=True)
    data = {"csrf_token": token, "template": "order_paid", "request_key": KEY.search(page).group(1), **form}
    return client.post(f"/console/orders/{ref}/emails/resend", data=data, headers=JSON)


def test_the_email_actions_are_behind_the_operators_login(fresh_app, fresh_client):
    anonymous = csrf_token(fresh_client, "/console/login")
    assert fresh_client.get("/console/orders/X/email", headers=HTML).headers["Location"].startswith("/console/login")
    assert fresh_client.get("/console/orders/X/email", headers=JSON).status_code == 401
    r = fresh_client.post("/console/orders/X/email", data={"csrf_token": anonymous, "email": "a@example.com"})
    assert r.status_code in (302, 401) and r.headers.get("Location", "/console/login").startswith("/console/login")


def test_an_operator_changes_the_orders_email_and_the_audit_trail_keeps_both(paid_order, mail_folder):
    app, client, token, ref, oid, old = paid_order
    form = client.get(f"/console/orders/{ref}/email")
    assert form.status_code == 200 and f"Its emails go to {old} now." in form.get_data(as_text=True)
    assert f"/console/orders/{ref}/email" in client.get(f"/console/orders/{ref}").get_data(as_text=True)

    r = client.post(
        f"/console/orders/{ref}/email",
        data={"csrf_token": token, "email": "ann.lee@example.org", "reason": "customer called: typo"},
        headers=JSON,
    )

    assert r.status_code == 200
    assert (r.get_json()["email"], r.get_json()["previous_email"]) == ("ann.lee@example.org", old)
    assert _email_of(app, oid) == "ann.lee@example.org"
    [action] = _audit(app)
    assert (action.action, action.order_id, action.status) == ("change_email", oid, 200)
    assert action.outcome == f"Order {ref}'s emails now go to ann.lee@example.org (was {old})."
    assert action.reason == "customer called: typo"
    # The order's emails go to the new address from now on.
    assert _resend(client, token, ref).status_code == 200
    run_everything(app)
    assert sorted(m["To"] for m in mails(mail_folder, "order_paid")) == sorted([old, "ann.lee@example.org"])


def test_a_new_email_that_is_no_address_or_the_same_one_changes_nothing(paid_order):
    app, client, token, ref, oid, old = paid_order

    bad = client.post(f"/console/orders/{ref}/email", data={"csrf_token": token, "email": "ann at home"}, headers=JSON)
    same = client.post(f"/console/orders/{ref}/email", data={"csrf_token": token, "email": old}, headers=JSON)
    page = client.post(f"/console/orders/{ref}/email", data={"csrf_token": token, "email": ""})

    assert bad.status_code == 400 and bad.get_json()["error"] == "That does not look like an email address."
    assert same.status_code == 409 and "already this order's address" in same.get_json()["error"]
    assert page.status_code == 400 and "Enter the order&#39;s new email address." in page.get_data(as_text=True)
    assert _email_of(app, oid) == old
    assert [(a.action, a.status) for a in _audit(app)] == [
        ("change_email", 400),
        ("change_email", 409),
        ("change_email", 400),
    ]


def test_an_email_is_sent_to_another_address_and_the_order_keeps_its_own(paid_order, mail_folder):
    app, client, token, ref, oid, old = paid_order
    confirm = client.get(f"/console/orders/{ref}/emails/resend?template=order_paid").get_data(as_text=True)
    assert f'name="to" maxlength="254" value="{old}"' in confirm

    r = _resend(client, token, ref, to="office@example.net")

    assert r.status_code == 200 and r.get_json()["to"] == "office@example.net"
    assert "on its way to office@example.net" in r.get_json()["message"]
    run_everything(app)
    assert sorted(m["To"] for m in mails(mail_folder, "order_paid")) == sorted([old, "office@example.net"])
    assert _email_of(app, oid) == old
    [action] = _audit(app)
    assert action.action == "resend_email" and "to another address (office@example.net)" in action.target


def test_another_address_that_is_no_address_sends_nothing(paid_order, mail_folder):
    app, client, token, ref, oid, old = paid_order

    r = _resend(client, token, ref, to="office at example")

    assert r.status_code == 400 and r.get_json()["error"] == "Send to: That does not look like an email address."
    run_everything(app)
    assert len(mails(mail_folder, "order_paid")) == 1


def test_a_resend_of_no_such_email_or_for_no_such_order_is_refused_in_words(paid_order):
    _app, client, token, ref, _oid, _email = paid_order
    words = "Choose one of the order's emails to send again (order_placed, order_paid"
    page = client.get(f"/console/orders/{ref}/emails/resend?template=nope", headers=JSON)
    assert page.status_code == 400 and words in page.get_json()["error"]
    data = {"csrf_token": token, "template": "nope", "request_key": "k" * 32}
    sent = client.post(f"/console/orders/{ref}/emails/resend", data=data, headers=JSON)
    assert sent.status_code == 400 and words in sent.get_json()["error"]
    missing = client.get("/console/orders/NO-SUCH/emails/resend?template=order_paid", headers=JSON)
    assert missing.status_code == 404 and missing.get_json()["error"] == "There is no order NO-SUCH."
