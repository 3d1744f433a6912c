"""An order that never got a payment session is held for UNPAID_HOLD_WITHOUT_SESSION_SECONDS, not
the whole payment window (docs/REFERENCE.md, Settings): its deadline (and the sweep, when the
deadline is missing) cancels it at the end of the hold and its stock comes back; "Pay now" before
then gives it the whole window from its session; an order whose session was made at checkout
never meets the hold. Real database, Redis and sandbox; time is injected through `now=`."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from factories import place_order_for, seed_catalog_rows
from payment_helpers import DEFAULT_SKU, Shopper, order_id, run_everything
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import Order, ScheduledCommand
from shop.orders.cancel import PROVIDER_FIRST_LOOK
from shop.scheduling.sweep import run_cycle

WINDOW = 1800  # UNPAID_ORDER_EXPIRY_SECONDS, the default
HOLD = 600  # UNPAID_HOLD_WITHOUT_SESSION_SECONDS, the default


def at(iso: str) -> datetime:
    return as_utc(datetime.fromisoformat(iso))


def available(browser: Shopper, sku: str = DEFAULT_SKU) -> int:
    """The catalog's stock of `sku`, as a customer reads it."""
    catalog = browser.client.get("/", headers={"Accept": "application/json"}).get_json()
    [variant] = [v for p in catalog["products"] for v in p["variants"] if v["sku"] == sku]
    return variant["available"]


def deadline_due(app, ref: str) -> datetime:
    with app.app_context():
        due = db.session.execute(
            select(ScheduledCommand.next_attempt_at).where(
                ScheduledCommand.kind == "expire_unpaid_order",
                ScheduledCommand.order_id == order_id(app, ref),
                ScheduledCommand.status == "pending",
            )
        ).scalar_one()
        db.session.remove()
    return as_utc(due)


def test_an_order_placed_without_a_payment_session_is_cancelled_at_the_short_hold_and_its_stock_comes_back(shop):
    browser = Shopper(shop)  # the provider cannot be reached: the order stands with "Pay now"
    before = available(browser)
    ref = browser.buy(quantity=2)
    order = browser.order(ref)
    assert (order["status"], order["payment"]) == ("PendingPayment", None)
    pay_by = at(order["pay_by"])
    assert pay_by == at(order["created_at"]) + timedelta(seconds=HOLD)  # not the 1800 s window
    assert deadline_due(shop, ref) == pay_by
    assert available(browser) == before - 2

    run_everything(shop, now=pay_by - timedelta(seconds=10))
    assert browser.order(ref)["status"] == "PendingPayment"
    assert available(browser) == before - 2

    run_everything(shop, now=pay_by + timedelta(seconds=1))
    order = browser.order(ref)
    assert (order["status"], order["cancelled_because"], order["inventory_restored"]) == ("Cancelled", "expired", True)
    assert available(browser) == before


def test_pay_now_before_the_hold_ends_gives_the_order_the_whole_window_from_its_session(make_shop, sandbox):
    app = make_shop(sandbox=True)
    browser = Shopper(app)
    before = available(browser)
    sandbox.faults(api_unavailable=True)
    ref = browser.buy(quantity=2)
    sandbox.faults(api_unavailable=False)
    held = browser.order(ref)
    hold_ends = at(held["pay_by"])
    assert (held["status"], hold_ends) == ("PendingPayment", at(held["created_at"]) + timedelta(seconds=HOLD))

    asked = utcnow()
    r = browser.pay(ref)
    assert r.status_code == 200 and r.get_json()["payment_url"], r.get_data(as_text=True)
    paying = browser.order(ref)
    pay_by = at(paying["pay_by"])
    assert paying["status"] == "PaymentInitiated"
    # The whole window from the session's creation (expires_at is whole seconds at the provider).
    assert asked + timedelta(seconds=WINDOW - 1) <= pay_by <= utcnow() + timedelta(seconds=WINDOW)
    assert deadline_due(app, ref) == hold_ends  # the deadline row armed at checkout is still the hold's ...

    run_everything(app, now=hold_ends + timedelta(seconds=5))
    # ... and finding the order at the payment page it waits for the session's own expiry.
    assert browser.order(ref)["status"] == "PaymentInitiated"
    assert available(browser) == before - 2
    assert deadline_due(app, ref) == pay_by + PROVIDER_FIRST_LOOK


def test_an_order_whose_session_was_made_at_checkout_keeps_the_whole_window(make_shop, sandbox):
    app = make_shop(sandbox=True)
    browser = Shopper(app)
    before = available(browser)
    order = browser.place()  # PaymentInitiated, sent to the hosted page
    created, pay_by = at(order["created_at"]), at(order["pay_by"])
    assert created + timedelta(seconds=WINDOW - 1) <= pay_by <= created + timedelta(seconds=WINDOW + 2)

    run_everything(app, now=created + timedelta(seconds=HOLD + 5))
    again = browser.order(order["reference"])
    assert (again["status"], at(again["pay_by"])) == ("PaymentInitiated", pay_by)
    assert available(browser) == before - 1
    assert deadline_due(app, order["reference"]) == pay_by + PROVIDER_FIRST_LOOK


def test_the_sweep_expires_an_order_without_a_session_at_the_end_of_its_hold_not_of_the_window(fresh_ctx):
    seed_catalog_rows()
    now = utcnow()
    stranded = place_order_for(now=now - timedelta(seconds=HOLD + 1)).order_id
    still_held = place_order_for(now=now - timedelta(seconds=HOLD - 30)).order_id

    result = run_cycle(now=now)  # the deadline rows are not run: the sweep alone decides

    assert result.expiry["cancelled"] == 1, (result.expiry, result.errors)
    db.session.expire_all()
    assert db.session.get(Order, stranded).status == "Cancelled"
    assert db.session.get(Order, still_held).status == "PendingPayment"
