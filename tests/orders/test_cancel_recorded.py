"""Every way an order becomes Cancelled writes why and when on its row (`cancel_reason`,
`cancelled_at`) in the same UPDATE as the state: the reason its OrderCancelled event carries, at
that event's time. The deadline, the customer's cancel, the sweep and an operator's reconcile each
end in the order store's one cancel; real database, Redis and sandbox."""

from __future__ import annotations

from datetime import datetime, timedelta

import stripe
from sqlalchemy import select

from factories import force_order, place_order_for, seed_catalog_rows
from payment_helpers import JSON, Shopper, order_id, run_everything
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.events import EventName
from shop.domain.order import CANCELLED_BY_CUSTOMER, PAYMENT_WINDOW_EXPIRED, OrderStatus
from shop.extensions import db
from shop.models import Order, OutboxEvent
from shop.scheduling.sweep import run_cycle
from support import log_in

HOLD = 600  # UNPAID_HOLD_WITHOUT_SESSION_SECONDS, the default


def recorded(oid: int) -> tuple:
    """(status, cancel_reason, cancelled_at) on the row, and (reason, time) of its last
    OrderCancelled event; in the caller's app context."""
    db.session.remove()
    row = db.session.get(Order, oid)
    assert row is not None
    event = db.session.execute(
        select(OutboxEvent)
        .where(OutboxEvent.order_id == oid, OutboxEvent.name == EventName.ORDER_CANCELLED)
        .order_by(OutboxEvent.id.desc())
        .limit(1)
    ).scalar_one()
    return (row.status, row.cancel_reason, row.cancelled_at), (event.payload["reason"], as_utc(event.created_at))


def assert_recorded(app, oid: int, reason: str) -> None:
    with app.app_context():
        (status, cancel_reason, cancelled_at), (event_reason, event_at) = recorded(oid)
        db.session.remove()
    assert status is OrderStatus.CANCELLED
    assert cancel_reason == event_reason
    assert cancel_reason is not None and cancel_reason.startswith(reason)
    assert cancelled_at == event_at


def test_the_deadline_records_that_the_payment_window_expired_and_when(shop):
    browser = Shopper(shop)  # the provider cannot be reached: the order stands with "Pay now"
    ref = browser.buy()
    pay_by = as_utc(datetime.fromisoformat(browser.order(ref)["pay_by"]))
    oid = order_id(shop, ref)
    with shop.app_context():
        assert recorded_columns(oid) == (OrderStatus.PENDING_PAYMENT, None, None)

    run_everything(shop, now=pay_by + timedelta(seconds=1))

    assert_recorded(shop, oid, PAYMENT_WINDOW_EXPIRED)


def recorded_columns(oid: int) -> tuple:
    db.session.remove()
    row = db.session.get(Order, oid)
    assert row is not None
    found = (row.status, row.cancel_reason, row.cancelled_at)
    db.session.remove()
    return found


def test_the_customers_cancel_records_that_the_customer_cancelled_and_when(make_shop, sandbox):
    app = make_shop(sandbox=True)
    browser = Shopper(app)
    order = browser.place()  # at the hosted page: the cancel expires the session first
    oid = order_id(app, order["reference"])

    assert browser.cancel(order["reference"], order["version"]).status_code == 200

    assert_recorded(app, oid, CANCELLED_BY_CUSTOMER)


def test_the_sweep_records_that_the_payment_window_expired_and_when(fresh_ctx):
    seed_catalog_rows()
    now = utcnow()
    stranded = place_order_for(now=now - timedelta(seconds=HOLD + 1)).order_id
    still_held = place_order_for(now=now - timedelta(seconds=HOLD - 30)).order_id

    run_cycle(now=now)  # the deadline rows are not run: the sweep alone decides

    assert_recorded(fresh_ctx, stranded, PAYMENT_WINDOW_EXPIRED)
    assert recorded_columns(still_held) == (OrderStatus.PENDING_PAYMENT, None, None)


def test_an_operators_reconcile_of_a_session_that_ran_out_records_the_expiry_and_when(make_shop, sandbox, fake_clock):
    app = make_shop(sandbox=True, CLOCK=fake_clock)
    browser = Shopper(app)
    order = browser.place()
    oid, session_id = order_id(app, order["reference"]), order["payment"]["session_id"]
    # The session ran out at its pay-by time and no webhook said so (this shop is not served to
    # the sandbox): the operator asks the provider.
    provider = stripe.StripeClient("sk_test_sandbox", base_addresses={"api": sandbox.base_url})
    provider.v1.checkout.sessions.expire(session_id)
    fake_clock.advance(app.config["UNPAID_ORDER_EXPIRY_SECONDS"] + 5)
    console = app.test_client()
    token = log_in(app, console)

    answer = console.post(f"/console/orders/{order['reference']}/reconcile", data={"csrf_token": token}, headers=JSON)

    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["outcome"] == "cancelled"
    assert_recorded(app, oid, PAYMENT_WINDOW_EXPIRED)


def test_a_cancel_saved_without_why_and_when_gets_them_from_its_compensation(make_shop, sandbox):
    """An old web still serving during an upgrade's roll cancels without the columns: the new
    workers' compensation of that OrderCancelled fills them in, the reason from the event and the
    time from the cancel's own write, and leaves a recorded cancel as it was."""
    app = make_shop(sandbox=True)
    browser = Shopper(app)
    old_web, new_web = browser.place(), browser.place()
    for order in (old_web, new_web):
        assert browser.cancel(order["reference"], order["version"]).status_code == 200
    old_id, new_id = order_id(app, old_web["reference"]), order_id(app, new_web["reference"])
    with app.app_context():
        force_order(old_id, cancel_reason=None, cancelled_at=None)  # as the older release left it
        cancelled_when = {oid: db.session.get(Order, oid).updated_at for oid in (old_id, new_id)}
        before = recorded(new_id)[0]
        db.session.remove()

    run_everything(app)

    with app.app_context():
        (_, old_reason, old_at), _ = recorded(old_id)
        assert db.session.get(Order, old_id).inventory_restored is True
        assert recorded(new_id)[0] == (OrderStatus.CANCELLED, *before[1:])
        db.session.remove()
    assert (old_reason, old_at) == (CANCELLED_BY_CUSTOMER, cancelled_when[old_id])
