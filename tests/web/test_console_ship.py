"""The console's ship action (docs/REFERENCE.md, Console: GET/POST /console/orders/<ref>/ship,
GET /console/shipping): asked, confirmed, done once however often it is posted, audited; the
customer's shipment email and the order's `fulfilment`; the list of orders to ship, oldest first."""

from __future__ import annotations

import pytest

from factories import on_hand
from payment_helpers import Shopper, order_id, paid_with_operator, run_everything
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import OperatorAction, Order, OutboxEvent
from shop.orders.stock_held import held_by_orders
from shop.payments.apply import reconcile_order
from support import csrf_token, mails

HTML, JSON = {"Accept": "text/html"}, {"Accept": "application/json"}


@pytest.fixture
def paid(mail_folder, make_fresh_app, sandbox):
    return paid_with_operator(make_fresh_app, sandbox, "SOCK-M", 2)


def _fulfilment(paid) -> dict:
    shopper = paid.app.test_client()
    r = shopper.get(f"/orders/{paid.reference}", query_string={"token": paid.access_token}, headers=JSON)
    assert r.status_code == 200
    return r.get_json()["fulfilment"]


def test_a_paid_order_is_unfulfilled_until_shipped_then_shows_when_and_its_tracking(paid, mail_folder):
    assert _fulfilment(paid) == {"status": "unfulfilled", "shipped_at": None, "tracking": None}
    confirm = paid.client.get(f"/console/orders/{paid.reference}/ship", headers=HTML)
    page = confirm.get_data(as_text=True)
    assert confirm.status_code == 200 and "Yes, it shipped" in page and "SOCK-M" in page
    assert _fulfilment(paid)["status"] == "unfulfilled"  # nothing moves on a GET

    r = paid.client.post(
        f"/console/orders/{paid.reference}/ship",
        data={"csrf_token": paid.token, "tracking": "  1Z 999\tAA1  "},
        headers=JSON,
    )
    assert r.status_code == 200, r.get_data(as_text=True)
    body = r.get_json()
    assert body["already"] is False and body["fulfilment"]["tracking"] == "1Z 999 AA1"
    shown = _fulfilment(paid)
    assert shown["status"] == "shipped" and shown["tracking"] == "1Z 999 AA1" and shown["shipped_at"]
    assert shown["shipped_at"] == body["fulfilment"]["shipped_at"]

    run_everything(paid.app)
    [notice] = mails(mail_folder, "order_shipped")
    assert notice["To"] == paid.email and paid.reference in notice["Subject"]
    text = notice.get_payload(decode=True).decode() if not notice.is_multipart() else notice.as_string()
    assert "Tracking number: 1Z 999 AA1" in text and "SOCK-M" in text

    page = paid.app.test_client().get(f"/orders/{paid.reference}", query_string={"token": paid.access_token})
    assert "Shipped on" in page.get_data(as_text=True) and "1Z 999 AA1" in page.get_data(as_text=True)


def test_a_second_ship_changes_nothing_and_sends_no_second_email(paid, mail_folder):
    url = f"/console/orders/{paid.reference}/ship"
    first = paid.client.post(url, data={"csrf_token": paid.token, "tracking": "T-1"}, headers=JSON)
    again = paid.client.post(url, data={"csrf_token": paid.token, "tracking": "T-2"}, headers=JSON)
    assert first.status_code == again.status_code == 200
    assert again.get_json()["already"] is True and "already shipped" in again.get_json()["message"]
    assert _fulfilment(paid)["tracking"] == "T-1"
    run_everything(paid.app)
    assert len(mails(mail_folder, "order_shipped")) == 1
    with paid.app.app_context():
        shipped = db.session.query(OutboxEvent).filter_by(order_id=paid.oid, name="OrderShipped").count()
        audited = db.session.query(OperatorAction).filter_by(order_id=paid.oid, action="ship").all()
        assert shipped == 1
        assert [a.status for a in audited] == [200, 200] and "already shipped" in audited[1].outcome
        db.session.remove()


def test_shipping_without_a_tracking_number_says_none_and_a_browser_goes_back_to_the_order(paid, mail_folder):
    r = paid.client.post(f"/console/orders/{paid.reference}/ship", data={"csrf_token": paid.token}, headers=HTML)
    assert r.status_code == 303 and r.headers["Location"].endswith(f"/console/orders/{paid.reference}")
    assert _fulfilment(paid)["tracking"] is None
    run_everything(paid.app)
    [notice] = mails(mail_folder, "order_shipped")
    assert "Tracking number" not in notice.as_string()


def test_an_unpaid_order_an_unknown_one_and_a_bad_tracking_number_are_refused_in_words(paid, sandbox):
    shopper = Shopper(paid.app, paid.skus)
    unpaid = shopper.place("SOCK-M", 1)["reference"]
    post = lambda ref, **form: paid.client.post(  # noqa: E731
        f"/console/orders/{ref}/ship", data={"csrf_token": paid.token, **form}, headers=JSON
    )
    r = post(unpaid)
    assert r.status_code == 409 and "Only a paid (or authorized) order can be shipped" in r.get_json()["error"]
    assert post("BK-NOSUCH0").status_code == 404
    long = post(paid.reference, tracking="9" * 101)
    assert long.status_code == 400 and "at most 100" in long.get_json()["error"]
    assert post(paid.reference, tracking="1Z\x07").status_code == 400
    assert _fulfilment(paid)["status"] == "unfulfilled"
    # Without the CSRF token nothing moves either.
    assert paid.client.post(f"/console/orders/{paid.reference}/ship", headers=JSON).status_code == 400
    assert _fulfilment(paid)["status"] == "unfulfilled"


def test_orders_to_ship_list_the_longest_paid_first_and_leave_a_shipped_one(paid, sandbox):
    shopper = Shopper(paid.app, paid.skus)
    second = shopper.place("SOCK-M", 1)
    sandbox.set_outcome(second["payment"]["session_id"], "paid")
    with paid.app.app_context():
        assert reconcile_order(order_id(paid.app, second["reference"])).outcome == "paid"
        db.session.remove()
    listed = paid.client.get("/console/shipping", headers=JSON).get_json()["orders"]
    assert [o["reference"] for o in listed] == [paid.reference, second["reference"]]
    paid.client.post(f"/console/orders/{paid.reference}/ship", data={"csrf_token": paid.token}, headers=JSON)
    listed = paid.client.get("/console/shipping", headers=JSON).get_json()["orders"]
    assert [o["reference"] for o in listed] == [second["reference"]]
    assert "Ship…" in paid.client.get("/console/shipping", headers=HTML).get_data(as_text=True)


def test_a_shipped_orders_units_no_longer_count_as_held_on_the_shelf(paid):
    sock = paid.skus["SOCK-M"]
    with paid.app.app_context():
        assert held_by_orders(sock).paid == 2
        before = on_hand(sock)
        db.session.remove()
    paid.client.post(f"/console/orders/{paid.reference}/ship", data={"csrf_token": paid.token}, headers=JSON)
    with paid.app.app_context():
        assert held_by_orders(sock).paid == 0
        assert on_hand(sock) == before  # shipping moves no stock: it was taken at checkout
        assert db.session.get(Order, paid.oid).status is OrderStatus.PAID
        db.session.remove()


def test_the_ship_pages_are_behind_the_operators_login(fresh_app, fresh_client):
    for url in ("/console/shipping", "/console/orders/BK-X/ship"):
        assert fresh_client.get(url, headers=JSON).status_code == 401, url
    anonymous = csrf_token(fresh_client, "/console/login")
    r = fresh_client.post("/console/orders/BK-X/ship", data={"csrf_token": anonymous}, headers=HTML)
    assert r.status_code == 302 and r.headers["Location"].startswith("/console/login")


def test_an_operator_cancels_a_live_order_but_not_a_paid_one(paid, sandbox):
    live = Shopper(paid.app, paid.skus).place("SOCK-M", 1)["reference"]
    url = "/console/orders/{}/cancel"
    r = paid.client.post(url.format(live), data={"csrf_token": paid.token, "reason": "customer phoned"}, headers=JSON)
    assert r.status_code == 200 and r.get_json()["voided"] is False
    refused = paid.client.post(url.format(paid.reference), data={"csrf_token": paid.token, "reason": "x"}, headers=JSON)
    assert refused.status_code == 409
    with paid.app.app_context():
        assert db.session.query(Order).filter_by(reference=live).one().status is OrderStatus.CANCELLED
        assert db.session.get(Order, paid.oid).status is OrderStatus.PAID
        db.session.remove()
