"""An `Authorized` order and a second payment session (CAPTURE_MODE=dispatch; docs/REFERENCE.md,
Guarantees: an Authorized order keeps one hold, and its customer is charged once): the customer
came back to an older page, or a link, and paid there too. Money held through the other session
is voided, never captured nor refunded; money taken at once through it (a method that is not
held) pays the order and the first hold is voided; the capture a ship queued takes only a hold
the order still owns; and money taken twice all the same is refunded once, as late money. Real
database, Redis and sandbox; webhooks signed as the sandbox signs them."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select

from held_payments import held_order
from payment_helpers import JSON, order_id, post_webhook, run_everything, sandbox_event
from shop.domain.deadlines import utcnow
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import CommandKind, Order, Refund, ScheduledCommand, WorkStatus
from shop.outbox.dispatch import run_command
from shop.payments.holds import CAPTURE_KEY
from shop.payments.refunds import PAID_TWICE
from shop.provider import gateway
from support import log_in, wait_until

S = OrderStatus
PI = gateway.PaymentIntentStatus


def _paid_through_another_session(app, sandbox, ref: str, *, held: bool) -> str:
    """A second session for the order, as an older page or a link makes one, paid by the customer:
    its card payment held (`held`, as the shop's own sessions ask), else taken at once (a method
    that is not held)."""
    oid = order_id(app, ref)
    with app.app_context():
        o = db.session.get(Order, oid)
        assert o is not None
        other = gateway.create_checkout_session(
            order_id=oid,
            reference=ref,
            attempt=9,
            lines=list(o.lines),
            currency=o.currency,
            email=o.email,
            success_url="http://shop.test/ok",
            cancel_url="http://shop.test/no",
            expires_at=utcnow() + timedelta(hours=1),
            hold_cards=held,
        )
        db.session.remove()
    assert sandbox.set_outcome(other.id, "paid")["payment_status"] == ("unpaid" if held else "paid")
    return other.id


def _payment(app, session_id: str) -> gateway.PaymentView:
    with app.app_context():
        found = gateway.retrieve_payment(gateway.retrieve_session(session_id).payment_intent)
        db.session.remove()
    return found


def _refunded_at_provider(app, session_id: str) -> int:
    with app.app_context():
        refunds = gateway.refunds_of_payment(gateway.retrieve_session(session_id).payment_intent)
        db.session.remove()
    return sum(r.amount or 0 for r in refunds if r.status == gateway.RefundStatus.SUCCEEDED)


def _order(app, ref: str) -> Order:
    with app.app_context():
        row = db.session.execute(select(Order).where(Order.reference == ref)).scalar_one()
        db.session.expunge(row)
        db.session.remove()
    return row


def _refunds(app) -> list[tuple[str | None, int, str]]:
    with app.app_context():
        found = [(r.session_id, r.amount, r.reason) for r in db.session.query(Refund).all()]
        db.session.remove()
    return found


def _captures(app) -> list[WorkStatus]:
    with app.app_context():
        found = [c.status for c in db.session.query(ScheduledCommand).filter_by(kind=CommandKind.CAPTURE_PAYMENT)]
        db.session.remove()
    return found


def _ship(app, ref: str) -> None:
    client = app.test_client()
    token = log_in(app, client)
    r = client.post(f"/console/orders/{ref}/ship", data={"csrf_token": token, "tracking": "1Z9"}, headers=JSON)
    assert r.status_code == 200 and r.get_json()["capturing"] is True, r.get_data(as_text=True)


def test_a_second_hold_for_an_authorized_order_is_voided_and_only_its_own_is_captured_at_the_ship(
    dispatch_shop, sandbox
):
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref, first = order["reference"], order["payment"]["session_id"]
    second = _paid_through_another_session(dispatch_shop, sandbox, ref, held=True)
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", second))
    assert r.get_json()["outcome"] == "void_created", r.get_json()
    run_everything(dispatch_shop)
    assert _payment(dispatch_shop, second).status == PI.CANCELED
    _ship(dispatch_shop, ref)
    run_everything(dispatch_shop)
    row = _order(dispatch_shop, ref)
    assert row.status is S.PAID and row.payment_session_id == first and row.shipped_at is not None
    assert _payment(dispatch_shop, first).amount_received == order["total"]
    assert _payment(dispatch_shop, second).status == PI.CANCELED and _refunds(dispatch_shop) == []


def test_money_taken_at_once_through_another_session_pays_an_authorized_order_and_voids_its_hold(
    dispatch_shop, sandbox
):
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref, first = order["reference"], order["payment"]["session_id"]
    second = _paid_through_another_session(dispatch_shop, sandbox, ref, held=False)
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", second))
    assert r.get_json()["outcome"] == "paid", r.get_json()
    run_everything(dispatch_shop)
    row = _order(dispatch_shop, ref)
    assert row.status is S.PAID and row.payment_session_id == second
    assert _payment(dispatch_shop, first).status == PI.CANCELED  # the first hold given back, not left to lapse
    assert _payment(dispatch_shop, second).amount_received == order["total"] and _refunds(dispatch_shop) == []


def test_a_queued_capture_takes_no_hold_of_an_order_paid_through_another_session_meanwhile(dispatch_shop, sandbox):
    """The ship queued the capture of the first hold; before it ran, the order was paid at once
    through another session: the capture takes nothing, the hold is voided, and the order ships
    on the money it has."""
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref, first = order["reference"], order["payment"]["session_id"]
    _ship(dispatch_shop, ref)
    second = _paid_through_another_session(dispatch_shop, sandbox, ref, held=False)
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", second))
    assert r.get_json()["outcome"] == "paid", r.get_json()
    run_everything(dispatch_shop)
    row = _order(dispatch_shop, ref)
    assert row.status is S.PAID and row.payment_session_id == second and row.shipped_at is not None
    assert _payment(dispatch_shop, first).status == PI.CANCELED and sandbox.events("charge.captured") == []
    assert _captures(dispatch_shop) == [WorkStatus.DONE] and _refunds(dispatch_shop) == []


def test_a_hold_captured_for_an_order_paid_through_another_session_is_refunded_once(dispatch_shop, sandbox):
    """Both taken all the same: the capture's first attempt took the hold at the provider and
    died before its commit; meanwhile the order was paid through another session. Its retry
    takes nothing more, the void finds the hold taken, and that money goes back once."""
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref, first = order["reference"], order["payment"]["session_id"]
    oid = order_id(dispatch_shop, ref)
    _ship(dispatch_shop, ref)
    intent = _payment(dispatch_shop, first).id
    with dispatch_shop.app_context():  # the first attempt's call, with the command's own key
        gateway.capture_payment(intent, None, CAPTURE_KEY.format(order=oid, intent=intent))
        db.session.remove()
    second = _paid_through_another_session(dispatch_shop, sandbox, ref, held=False)
    event = sandbox_event(sandbox, "checkout.session.completed", second)
    assert post_webhook(shopper.client, event).get_json()["outcome"] == "paid"
    run_everything(dispatch_shop)
    run_everything(dispatch_shop, now=utcnow() + timedelta(minutes=5))
    row = _order(dispatch_shop, ref)
    assert row.status is S.PAID and row.payment_session_id == second and row.shipped_at is not None
    assert _refunds(dispatch_shop) == [(first, order["total"], PAID_TWICE)]
    assert _refunded_at_provider(dispatch_shop, first) == order["total"]
    assert _refunded_at_provider(dispatch_shop, second) == 0
    assert len(sandbox.events("charge.captured")) == 1 and _captures(dispatch_shop) == [WorkStatus.DONE]


def test_a_capture_under_way_when_the_order_is_paid_through_another_session_ships_and_refunds_once(
    dispatch_shop, sandbox, is_postgres
):
    """The capture read the order Authorized and asked the provider about its hold; the order was
    paid through another session before the provider answered. The capture is not the order's payment any
    more: the order ships on the money it has, and the hold's money goes back once, not a dead
    letter. (SQLite serialises the two writers, so only PostgreSQL lets them overlap.)"""
    if not is_postgres:
        pytest.skip("SQLite's one writer at a time cannot interleave a capture with a webhook")
    shopper, order, _sid = held_order(dispatch_shop, sandbox)
    ref, first = order["reference"], order["payment"]["session_id"]
    _ship(dispatch_shop, ref)
    second = _paid_through_another_session(dispatch_shop, sandbox, ref, held=False)
    with dispatch_shop.app_context():
        [capture] = db.session.execute(
            select(ScheduledCommand.id).where(ScheduledCommand.kind == CommandKind.CAPTURE_PAYMENT)
        ).scalars()
        db.session.remove()
    with sandbox.api_hanging():

        def run():
            with dispatch_shop.app_context():
                run_command(capture)
                db.session.remove()

        capturing = threading.Thread(target=run)
        capturing.start()
        # A call the hang holds (no status yet) is the capture's: it read the order Authorized
        # first. (The calls before it all have their answers.)
        wait_until(lambda: any(c["status"] is None for c in sandbox.requests()), 10, "the capture to ask the provider")
        r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", second))
        assert r.get_json()["outcome"] == "paid", r.get_json()
    capturing.join(30)
    run_everything(dispatch_shop)
    row = _order(dispatch_shop, ref)
    assert row.status is S.PAID and row.payment_session_id == second and row.shipped_at is not None
    assert _captures(dispatch_shop) == [WorkStatus.DONE]
    assert _refunds(dispatch_shop) == [(first, order["total"], PAID_TWICE)]
    assert _refunded_at_provider(dispatch_shop, first) == order["total"]
