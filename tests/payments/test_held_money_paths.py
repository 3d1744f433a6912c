"""Every path that applies the provider's word knows a held card payment (CAPTURE_MODE=dispatch;
docs/REFERENCE.md, Order states): the return page, the deadline, the sweep order by order and in
bulk from the event list (whose events carry no payment), and the scan for money no order holds.
Held money an order can still take is adopted as Authorized when it pays the order exactly; held
money for no order is voided, never captured and refunded. Real database, Redis and sandbox; no
webhook reaches the shop unless a test posts it, as after an outage of its endpoint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from factories import catalog_rows, force_order, place_order_for
from payment_helpers import Shopper, order_id, post_webhook, run_due_commands, run_everything, sandbox_event
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import CommandKind, Order, PaymentProofRefusal, Refund, ScheduledCommand, UnknownPayment
from shop.payments.apply import ask_and_apply, reconcile_order
from shop.payments.start import start_payment
from shop.provider import gateway
from shop.provider.mark import shop_mark
from shop.scheduling.passes.in_doubt import BULK_THRESHOLD
from shop.scheduling.sweep import run_cycle

S = OrderStatus


def held_at_the_provider(app, sandbox) -> tuple[Shopper, dict]:
    """An order at its payment page whose card payment the sandbox now holds; no webhook applied."""
    shopper = Shopper(app, app.skus)
    order = shopper.place("SOCK-M", 1)
    assert sandbox.set_outcome(order["payment"]["session_id"], "paid")["payment_status"] == "unpaid"
    return shopper, order


def row_of(app, reference: str) -> Order:
    with app.app_context():
        row = db.session.execute(select(Order).where(Order.reference == reference)).scalar_one()
        db.session.expunge(row)
        db.session.remove()
    return row


def end_hold_armed(app, oid: int) -> bool:
    with app.app_context():
        kinds = db.session.execute(select(ScheduledCommand.kind).where(ScheduledCommand.order_id == oid)).scalars()
        armed = CommandKind.END_HOLD in set(kinds)
        db.session.remove()
    return armed


def intent_status(app, session_id: str) -> str | None:
    with app.app_context():
        status = gateway.retrieve_payment(gateway.retrieve_session(session_id).payment_intent).status
        db.session.remove()
    return status


def a_window_later():
    return utcnow() + timedelta(seconds=1800 + 60)  # every order placed now is stuck by then


@pytest.mark.parametrize("status", [S.PENDING_PAYMENT, S.PAYMENT_FAILED])
def test_held_money_for_an_order_no_longer_at_its_payment_page_is_adopted_as_authorized(dispatch_shop, sandbox, status):
    _shopper, order = held_at_the_provider(dispatch_shop, sandbox)
    ref, oid = order["reference"], order_id(dispatch_shop, order["reference"])
    with dispatch_shop.app_context():
        force_order(ref, status=status.value)  # as a failed attempt, or a restored copy, leaves it
        assert reconcile_order(oid).outcome == "authorized"
        db.session.remove()
    row = row_of(dispatch_shop, ref)
    assert row.status is S.AUTHORIZED and row.payment_session_id == order["payment"]["session_id"]
    assert row.hold_expires_at is not None and row.charged == order["total"]
    assert end_hold_armed(dispatch_shop, oid)  # the adopted hold has its deadline like any other
    assert intent_status(dispatch_shop, order["payment"]["session_id"]) == gateway.PaymentIntentStatus.REQUIRES_CAPTURE


def test_held_money_for_an_order_waiting_at_another_payment_page_is_taken_as_its_payment(dispatch_shop, sandbox):
    """As paid money is: the order waits for a payment, and this one is real (the other page, if
    ever paid too, is money for an Authorized order through another session: voided)."""
    _shopper, order = held_at_the_provider(dispatch_shop, sandbox)
    ref, sid = order["reference"], order["payment"]["session_id"]
    with dispatch_shop.app_context():
        force_order(ref, payment_session_id="cs_test_a_newer_page")
        assert ask_and_apply(sid, source="console").applied.outcome == "authorized"
        db.session.remove()
    row = row_of(dispatch_shop, ref)
    assert row.status is S.AUTHORIZED and row.payment_session_id == sid


def test_held_money_that_does_not_pay_the_order_exactly_is_refused_for_an_operator_not_adopted(dispatch_shop, sandbox):
    _shopper, order = held_at_the_provider(dispatch_shop, sandbox)
    ref, oid = order["reference"], order_id(dispatch_shop, order["reference"])
    with dispatch_shop.app_context():
        force_order(ref, status=S.PAYMENT_FAILED.value, total=order["total"] + 100)
        applied = reconcile_order(oid)
        refusals = db.session.query(PaymentProofRefusal).filter_by(order_id=oid).count()
        db.session.remove()
    assert applied.outcome == "proof_refused" and "!= order total" in applied.detail
    assert row_of(dispatch_shop, ref).status is S.PAYMENT_FAILED and refusals == 1


def test_a_hold_made_before_the_mode_went_back_to_checkout_is_still_authorized_by_the_webhook(dispatch_shop, sandbox):
    """The session itself asked for the card payment to be held: its notice is read with its
    payment whatever CAPTURE_MODE says now, so the order does not wait as if a bank were paying."""
    shopper, order = held_at_the_provider(dispatch_shop, sandbox)
    dispatch_shop.config["CAPTURE_MODE"] = "checkout"  # switched back; this session was made before
    event = sandbox_event(sandbox, "checkout.session.completed", order["payment"]["session_id"])
    r = post_webhook(shopper.client, event)
    assert r.get_json()["outcome"] == "authorized", r.get_json()
    assert row_of(dispatch_shop, order["reference"]).status is S.AUTHORIZED


def test_the_return_page_authorizes_a_held_payment_and_does_not_say_it_is_being_processed(dispatch_shop, sandbox):
    shopper, order = held_at_the_provider(dispatch_shop, sandbox)
    ref, sid = order["reference"], order["payment"]["session_id"]
    r = shopper.client.get("/checkout/return", query_string={"order": ref, "session_id": sid})
    assert r.status_code == 303
    page = shopper.client.get(r.headers["Location"]).get_data(as_text=True)
    assert row_of(dispatch_shop, ref).status is S.AUTHORIZED
    assert "being processed" not in page


def test_the_deadline_of_an_order_whose_payment_is_held_authorizes_it_instead_of_waiting(dispatch_shop, sandbox):
    _shopper, order = held_at_the_provider(dispatch_shop, sandbox)
    ref = order["reference"]
    ends = as_utc(row_of(dispatch_shop, ref).payment_session_expires_at)
    run_everything(dispatch_shop, now=ends + timedelta(seconds=10))
    assert row_of(dispatch_shop, ref).status is S.AUTHORIZED


def test_the_sweep_asking_order_by_order_authorizes_a_held_payment(dispatch_shop, sandbox):
    _shopper, order = held_at_the_provider(dispatch_shop, sandbox)
    with dispatch_shop.app_context():
        result = run_cycle(now=a_window_later())
        db.session.remove()
    assert result.status == "ok", result.errors
    assert result.provider.get("authorized") == 1, result.provider
    assert row_of(dispatch_shop, order["reference"]).status is S.AUTHORIZED


def test_the_sweeps_bulk_path_authorizes_held_payments_its_events_cannot_show(dispatch_shop, sandbox):
    """The event list's completed sessions say `unpaid` and carry no payment: the orders they
    name are asked about in the same cycle, and each held one becomes Authorized at once."""
    with dispatch_shop.app_context():
        [variant] = catalog_rows(BULK_THRESHOLD + 10)
        started = []
        for _ in range(BULK_THRESHOLD + 2):
            placed = place_order_for({variant: 1})
            assert start_payment(placed.order_id, placed=placed).status == "started"
            started.append(placed.order_id)
        sessions = db.session.execute(select(Order.payment_session_id).where(Order.id.in_(started))).scalars().all()
        db.session.rollback()
        for sid in sessions:
            sandbox.set_outcome(sid, "paid")
        result = run_cycle(now=a_window_later())
        statuses = db.session.execute(select(Order.status).where(Order.id.in_(started))).scalars().all()
        db.session.remove()
    assert result.status == "ok", result.errors
    assert result.provider.get("event_pages", 0) >= 1  # the bulk path read the list
    assert set(statuses) == {S.AUTHORIZED}, statuses
    assert result.provider.get("authorized") == len(started), result.provider


def held_session_for_no_order(app, *, oid: int, reference: str, amount: int = 2500) -> str:
    """A session made as the shop makes one under CAPTURE_MODE=dispatch, for an order the database
    lacks (a restored copy's), its card payment then held by the sandbox."""
    with app.app_context():
        session = gateway.client().v1.checkout.sessions.create(
            params={
                "mode": "payment",
                "client_reference_id": reference,
                "metadata": {"order_id": str(oid), "reference": reference, "shop": shop_mark()},
                "payment_method_options": {"card": {"capture_method": "manual"}},
                "customer_email": "lost@example.com",
                "success_url": "http://shop.test/return",
                "cancel_url": "http://shop.test/cancel",
                "line_items": [
                    {
                        "quantity": 1,
                        "price_data": {"currency": "usd", "unit_amount": amount, "product_data": {"name": "Lost"}},
                    }
                ],
            }
        )
        db.session.remove()
    return session.id


def sweep_later(app, minutes: float = 2):
    later = utcnow() + timedelta(minutes=minutes)
    with app.app_context():
        result = run_cycle(now=later)
        db.session.remove()
    run_due_commands(app, later + timedelta(minutes=1))
    return result


def test_the_scan_for_unknown_money_voids_a_hold_for_an_order_the_database_lacks(dispatch_shop, sandbox):
    with dispatch_shop.app_context():
        run_cycle()  # the scan's mark, older than the payment (a restored copy's is)
        db.session.remove()
    sid = held_session_for_no_order(dispatch_shop, oid=515151, reference="BK-HELDLOST")
    sandbox.set_outcome(sid, "paid")
    result = sweep_later(dispatch_shop)
    assert result.provider.get("unknown_order") == 1, result.summary()
    with dispatch_shop.app_context():
        [row] = db.session.query(UnknownPayment).all()
        found = (row.status, row.found_via)
        refunds = db.session.query(Refund).count()
        db.session.remove()
    assert found == ("voided", "sweep: unknown money")
    assert intent_status(dispatch_shop, sid) == gateway.PaymentIntentStatus.CANCELED and refunds == 0


def test_the_scan_adopts_a_hold_for_an_order_restored_without_its_session(dispatch_shop, sandbox):
    """The copy has the order PendingPayment with no session (placed while the provider was down);
    the card payment the lost machine's session took is held: the order becomes Authorized."""
    shopper = Shopper(dispatch_shop, dispatch_shop.skus)
    sandbox.faults(api_unavailable=True)
    assert shopper.checkout("SOCK-M", 1).status_code == 303
    sandbox.faults(api_unavailable=False)
    order = shopper.latest()
    oid = order_id(dispatch_shop, order["reference"])
    with dispatch_shop.app_context():
        run_cycle()
        db.session.remove()
    sid = held_session_for_no_order(dispatch_shop, oid=oid, reference=order["reference"], amount=order["total"])
    sandbox.set_outcome(sid, "paid")
    result = sweep_later(dispatch_shop, minutes=1.5)
    assert result.provider.get("authorized") == 1, result.summary()
    row = row_of(dispatch_shop, order["reference"])
    assert row.status is S.AUTHORIZED and row.payment_session_id == sid
    assert intent_status(dispatch_shop, sid) == gateway.PaymentIntentStatus.REQUIRES_CAPTURE
