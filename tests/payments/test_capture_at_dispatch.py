"""CAPTURE_MODE=dispatch against the bundled sandbox (docs/REFERENCE.md, Order states): a card
payment is only held at checkout (the order is Authorized), the console's ship captures it once
and then the order is Paid and shipped; a cancel before the capture voids the hold (no refund)
and gives the stock back; money held for a cancelled order is voided (a refused capture:
test_capture_refusals.py). CAPTURE_MODE=checkout sessions ask for no manual capture."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from factories import force_order, on_hand
from held_payments import held_order
from payment_helpers import JSON, Shopper, order_id, post_webhook, run_everything
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import CommandKind, Order, Refund, ScheduledCommand, WorkStatus
from shop.orders.stock_held import held_by_orders
from shop.payments.apply import reconcile_order
from shop.payments.holds import end_hold
from shop.provider import gateway
from shop.provider.checkout_params import session_params
from support import log_in, mails

S = OrderStatus


def _row(app, ref: str) -> dict:
    with app.app_context():
        o = db.session.query(Order).filter_by(reference=ref).one()
        found = {"status": o.status, "hold_expires_at": o.hold_expires_at, "shipped_at": o.shipped_at}
        db.session.remove()
    return found


def _intent(app, ref: str) -> gateway.PaymentView:
    with app.app_context():
        session_id = db.session.query(Order.payment_session_id).filter_by(reference=ref).scalar()
        found = gateway.retrieve_payment(gateway.retrieve_session(session_id).payment_intent)
        db.session.remove()
    return found


def test_a_held_card_payment_makes_the_order_authorized_with_its_hold_deadline(dispatch_shop, sandbox):
    _shopper, order, _sid = held_order(dispatch_shop, sandbox)
    assert order["status"] == "Authorized" and order["payment"]["status"] == "authorized"
    assert order["charged"] == order["total"] and order["fulfilment"]["status"] == "unfulfilled"
    row = _row(dispatch_shop, order["reference"])
    assert row["hold_expires_at"] is not None and row["hold_expires_at"] > datetime.now(timezone.utc)
    assert _intent(dispatch_shop, order["reference"]).held
    # The order keeps its stock (taken at checkout) and counts as sold, not as held by a live order.
    with dispatch_shop.app_context():
        assert held_by_orders(dispatch_shop.skus["SOCK-M"]).paid == 1
        db.session.remove()


def test_the_return_page_and_a_reconcile_recognise_the_hold_too(dispatch_shop, sandbox):
    shopper = Shopper(dispatch_shop, dispatch_shop.skus)
    order = shopper.place("SOCK-M", 1)
    sandbox.set_outcome(order["payment"]["session_id"], "paid")
    with dispatch_shop.app_context():
        assert reconcile_order(order_id(dispatch_shop, order["reference"])).outcome == "authorized"
        db.session.remove()
    assert shopper.order(order["reference"])["status"] == "Authorized"


def test_shipping_captures_the_hold_once_then_the_order_is_paid_shipped_and_emailed(
    dispatch_shop, sandbox, mail_folder
):
    _shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref = order["reference"]
    client = dispatch_shop.test_client()
    token = log_in(dispatch_shop, client)
    first = client.post(f"/console/orders/{ref}/ship", data={"csrf_token": token, "tracking": "1Z1"}, headers=JSON)
    again = client.post(f"/console/orders/{ref}/ship", data={"csrf_token": token, "tracking": "1Z2"}, headers=JSON)
    assert first.status_code == again.status_code == 200
    assert first.get_json()["capturing"] is True and first.get_json()["already"] is False
    assert again.get_json()["already"] is True
    run_everything(dispatch_shop)
    row = _row(dispatch_shop, ref)
    assert row["status"] is S.PAID and row["shipped_at"] is not None
    payment = _intent(dispatch_shop, ref)
    assert payment.status == gateway.PaymentIntentStatus.SUCCEEDED and payment.amount_received == order["total"]
    assert len(sandbox.events("charge.captured")) == 1
    with dispatch_shop.app_context():
        captures = db.session.query(ScheduledCommand).filter_by(kind=CommandKind.CAPTURE_PAYMENT).all()
        assert [(c.status, c.payload["tracking"]) for c in captures] == [(WorkStatus.DONE, "1Z1")]
        db.session.remove()
    assert len(mails(mail_folder, "order_paid")) == 1 and len(mails(mail_folder, "order_shipped")) == 1
    assert "1Z1" in mails(mail_folder, "order_shipped")[0].as_string()


def test_a_customer_cancel_before_shipping_voids_the_hold_refunds_nothing_and_gives_the_stock_back(
    dispatch_shop, sandbox
):
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    sock = dispatch_shop.skus["SOCK-M"]
    before = on_hand(sock, dispatch_shop)
    r = shopper.cancel(order["reference"], order["version"])
    assert r.status_code == 200 and r.get_json()["status"] == "Cancelled", r.get_data(as_text=True)
    run_everything(dispatch_shop)
    assert _intent(dispatch_shop, order["reference"]).status == gateway.PaymentIntentStatus.CANCELED
    assert on_hand(sock, dispatch_shop) == before + 1
    with dispatch_shop.app_context():
        assert db.session.query(Refund).count() == 0
        db.session.remove()


def test_a_cancel_is_refused_in_words_once_the_ship_asked_for_the_capture(dispatch_shop, sandbox):
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    client = dispatch_shop.test_client()
    token = log_in(dispatch_shop, client)
    client.post(f"/console/orders/{order['reference']}/ship", data={"csrf_token": token}, headers=JSON)
    r = shopper.cancel(order["reference"], order["version"])
    assert r.status_code == 409 and "being shipped" in r.get_data(as_text=True)


def test_money_held_for_a_cancelled_order_is_voided_not_refunded(dispatch_shop, sandbox):
    shopper = Shopper(dispatch_shop, dispatch_shop.skus)
    order = shopper.place("SOCK-M", 1)
    sandbox.set_outcome(order["payment"]["session_id"], "paid")
    with dispatch_shop.app_context():
        force_order(order["reference"], status="Cancelled")
        applied = reconcile_order(order_id(dispatch_shop, order["reference"]))
        assert applied.outcome == "void_created"
        again = reconcile_order(order_id(dispatch_shop, order["reference"]))
        assert again.outcome == "noop"  # one void per session
        db.session.remove()
    run_everything(dispatch_shop)
    assert _intent(dispatch_shop, order["reference"]).status == gateway.PaymentIntentStatus.CANCELED
    with dispatch_shop.app_context():
        assert db.session.query(Refund).count() == 0
        db.session.remove()


def test_only_dispatch_mode_asks_the_provider_to_hold_card_payments(fresh_app):
    terms = dict(
        order_id=1,
        reference="BK-TEST0001",
        attempt=1,
        lines=[],
        currency="usd",
        email="a@example.com",
        success_url="http://shop.test/ok",
        cancel_url="http://shop.test/no",
        expires_at=datetime.now(timezone.utc),
    )
    with fresh_app.app_context():
        plain, held = session_params(**terms), session_params(**terms, hold_cards=True)
    assert "payment_method_options" not in plain
    assert held.get("payment_method_options") == {"card": {"capture_method": "manual"}}
    assert "capture_method" not in held.get("payment_intent_data", {})  # other methods capture at once


def test_an_operator_cancels_an_authorized_order_with_a_reason_and_its_hold_is_voided(dispatch_shop, sandbox):
    _shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref = order["reference"]
    client = dispatch_shop.test_client()
    token = log_in(dispatch_shop, client)
    page = client.get(f"/console/orders/{ref}/cancel").get_data(as_text=True)
    assert "nothing is taken, nothing refunded" in page
    without = client.post(f"/console/orders/{ref}/cancel", data={"csrf_token": token}, headers=JSON)
    assert without.status_code == 400 and _row(dispatch_shop, ref)["status"] is S.AUTHORIZED
    r = client.post(f"/console/orders/{ref}/cancel", data={"csrf_token": token, "reason": "fraud check"}, headers=JSON)
    assert r.status_code == 200 and r.get_json()["voided"] is True, r.get_data(as_text=True)
    run_everything(dispatch_shop)
    assert _row(dispatch_shop, ref)["status"] is S.CANCELLED
    assert _intent(dispatch_shop, ref).status == gateway.PaymentIntentStatus.CANCELED
    again = client.post(f"/console/orders/{ref}/cancel", data={"csrf_token": token, "reason": "again"}, headers=JSON)
    assert again.status_code == 409 and "not cancelled" in again.get_json()["error"]


def test_an_unshipped_order_is_voided_and_cancelled_a_margin_before_its_hold_lapses(
    dispatch_shop, sandbox, mail_folder
):
    _shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref = order["reference"]
    lapses = _row(dispatch_shop, ref)["hold_expires_at"]
    sock = dispatch_shop.skus["SOCK-M"]
    before = on_hand(sock, dispatch_shop)
    run_everything(dispatch_shop, now=lapses - timedelta(hours=2))  # before the margin: nothing moves
    assert _row(dispatch_shop, ref)["status"] is S.AUTHORIZED
    run_everything(dispatch_shop, now=lapses - timedelta(minutes=59))  # within the hour's margin
    assert _row(dispatch_shop, ref)["status"] is S.CANCELLED
    assert _intent(dispatch_shop, ref).status == gateway.PaymentIntentStatus.CANCELED
    assert on_hand(sock, dispatch_shop) == before + 1
    [notice] = mails(mail_folder, "order_hold_ended")
    assert "Nothing was charged" in notice.as_string()


def test_the_holds_deadline_leaves_an_order_whose_capture_is_under_way(dispatch_shop, sandbox):
    _shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref = order["reference"]
    lapses = _row(dispatch_shop, ref)["hold_expires_at"]
    with dispatch_shop.app_context():
        force_order(ref, capture_requested_at=lapses - timedelta(hours=3))
        db.session.remove()
    with dispatch_shop.app_context():
        assert end_hold(order_id(dispatch_shop, ref), lapses - timedelta(minutes=30)) == "being_captured"
        db.session.remove()
    assert _row(dispatch_shop, ref)["status"] is S.AUTHORIZED


def test_the_dashboard_shows_a_hold_lapsing_within_the_warning_as_needing_a_human(dispatch_shop, sandbox):
    client = dispatch_shop.test_client()
    log_in(dispatch_shop, client)
    calm = next(c for c in client.get("/console/", headers=JSON).get_json()["cards"] if c["key"] == "holds")
    assert calm["ok"] is True and calm["count"] == 0
    _shopper, order, _sid = held_order(dispatch_shop, sandbox)
    with dispatch_shop.app_context():
        force_order(order["reference"], hold_expires_at=datetime.now(timezone.utc) + timedelta(hours=5))
        db.session.remove()
    card = next(c for c in client.get("/console/", headers=JSON).get_json()["cards"] if c["key"] == "holds")
    assert card["ok"] is False and card["count"] == 1 and "lapse within" in card["words"]
    assert card["url"] == "/console/shipping"


def test_a_hold_that_lapsed_at_the_provider_ends_the_order_as_the_deadline_would(dispatch_shop, sandbox, mail_folder):
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    sandbox.advance_clock(8 * 24 * 3600)  # the hold lapses on the sandbox's clock
    [lapsed] = [
        r["event"]
        for r in sandbox.events("payment_intent.canceled")
        if r["event"]["data"]["object"]["metadata"].get("order_id") == str(order_id(dispatch_shop, order["reference"]))
    ]
    r = post_webhook(shopper.client, lapsed)
    assert r.get_json()["outcome"] == "cancelled", r.get_json()
    assert post_webhook(shopper.client, lapsed).get_json()["outcome"] in ("noop", "duplicate")
    run_everything(dispatch_shop)
    assert _row(dispatch_shop, order["reference"])["status"] is S.CANCELLED
    assert len(mails(mail_folder, "order_hold_ended")) == 1
