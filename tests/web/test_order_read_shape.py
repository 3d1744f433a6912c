"""An order's pages and JSON say the same for a pending, a paid and a cancelled order (each reason)
whichever shape they are drawn from: the order page, its JSON, the cancel page, the customer's list
and the console's order. Why and when a cancelled order was cancelled is what its OrderCancelled
event said, read from the order's own row. Real database, Redis and sandbox."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from factories import force_order
from payment_helpers import HTML, JSON, Shopper, order_id, run_everything
from shop.domain.deadlines import as_utc
from shop.domain.events import EventName
from shop.domain.timestamps import iso
from shop.extensions import db
from shop.models import OutboxEvent
from shop.orders.cancel import CancelStatus, cancel_order
from shop.payments.apply import reconcile_order
from support import log_in

HOLD = 600  # UNPAID_HOLD_WITHOUT_SESSION_SECONDS, the default
ORDER_KEYS = {
    "reference",
    "status",
    "version",
    "total",
    "currency",
    "inventory_restored",
    "lines",
    "payment",
    "refunds",
    "created_at",
    "updated_at",
    "pay_by",
    "last_payment_error",
    "ships",
    "shipping",
    # What the payment charged and what went back: null (tax, charged) until paid.
    "tax",
    "charged",
    "refunded",
    # How the goods left: {"status": "unfulfilled" | "shipped", "shipped_at", "tracking"}.
    "fulfilment",
}
CANCELLED_KEYS = ORDER_KEYS | {"cancelled_because", "cancelled_at"}
CONSOLE_KEYS = ORDER_KEYS | {
    "email",
    # How much of a paid order's payment went back, what the customer paid net, and what is left.
    "money_back",
    "net",
    "refundable",
    "payment_attempts",
    "age_seconds",
    "stuck",
    "provider_next_check_at",
    "provider_next_check_in_seconds",
    "watched_for_late_money",
}


def page(browser: Shopper, url: str) -> str:
    answer = browser.client.get(url, headers=HTML)
    assert answer.status_code == 200, answer.status_code
    return answer.get_data(as_text=True)


def listed(browser: Shopper, ref: str) -> tuple[dict, str]:
    """The order as the customer's list gives it: its JSON row, and the row of the HTML list."""
    [row] = [o for o in browser.client.get("/orders", headers=JSON).get_json()["orders"] if o["reference"] == ref]
    html = page(browser, "/orders")
    start = html.index(f">{ref}</a>")
    return row, html[start : html.index("</tr>", start)]


def console_order(app, ref: str) -> dict:
    console = app.test_client()
    log_in(app, console)
    answer = console.get(f"/console/orders/{ref}", headers=JSON)
    assert answer.status_code == 200, answer.status_code
    return answer.get_json()["order"]


def last_cancel_event(app, ref: str) -> tuple[str, str | None]:
    with app.app_context():
        event = db.session.execute(
            select(OutboxEvent)
            .where(OutboxEvent.order_id == order_id(app, ref), OutboxEvent.name == EventName.ORDER_CANCELLED)
            .order_by(OutboxEvent.id.desc())
            .limit(1)
        ).scalar_one()
        found = event.payload.get("reason", ""), iso(as_utc(event.created_at))
        db.session.remove()
    return found


def assert_the_list_and_console_agree(app, browser: Shopper, order: dict, badge: tuple[str, str]) -> dict:
    """The customer's list and the console's order say what the order's JSON says; the console's order."""
    row, html_row = listed(browser, order["reference"])
    assert row == {k: order[k] for k in ("reference", "status", "total", "currency", "created_at")}
    assert f'<span class="badge {badge[0]}">{badge[1]}</span>' in html_row
    summary = console_order(app, order["reference"])
    assert set(summary) == CONSOLE_KEYS
    assert {k: summary[k] for k in ORDER_KEYS - {"last_payment_error"}} == {
        k: order[k] for k in ORDER_KEYS - {"last_payment_error"}
    }
    return summary


def test_a_pending_order_reads_the_same_on_its_page_json_cancel_page_list_and_console(shop):
    browser = Shopper(shop)  # the provider cannot be reached: the order stands with "Pay now"
    ref = browser.buy(quantity=2)
    order = browser.order(ref)

    assert set(order) == ORDER_KEYS
    assert (order["status"], order["payment"], order["last_payment_error"]) == ("PendingPayment", None, None)
    assert as_utc(datetime.fromisoformat(order["pay_by"])) == as_utc(
        datetime.fromisoformat(order["created_at"])
    ) + timedelta(seconds=HOLD)
    assert [(line["quantity"], line["unit_price"]) for line in order["lines"]] == [(2, order["total"] // 2)]
    html = page(browser, f"/orders/{ref}")
    assert '<span class="badge awaiting">Awaiting payment</span>' in html
    assert "Your order is saved and its items are held for you until" in html and "Pay now" in html
    assert f"/orders/{ref}/cancel?version={order['version']}" in html
    assert browser.client.get(f"/orders/{ref}/cancel", headers=JSON).get_json() == order
    assert f"Cancel order {ref}?" in page(browser, f"/orders/{ref}/cancel")
    assert_the_list_and_console_agree(shop, browser, order, ("awaiting", "Awaiting payment"))


def test_a_paid_order_reads_the_same_on_its_page_json_list_and_console(make_shop, sandbox):
    app = make_shop(sandbox=True)
    browser = Shopper(app)
    placed = browser.place()
    sandbox.set_outcome(placed["payment"]["session_id"], "paid")
    with app.app_context():
        assert reconcile_order(order_id(app, placed["reference"])).outcome == "paid"
        db.session.remove()
    ref = placed["reference"]
    order = browser.order(ref)

    assert set(order) == ORDER_KEYS
    assert (order["status"], order["payment"]["status"], order["pay_by"]) == ("Paid", "paid", None)
    assert order["payment"]["session_id"] == placed["payment"]["session_id"]
    html = page(browser, f"/orders/{ref}")
    assert '<span class="badge paid">Paid</span>' in html
    assert f"A receipt is on its way to {browser.email}" in html and "Cancel order" not in html
    assert browser.client.get(f"/orders/{ref}/cancel", headers=HTML).status_code == 303
    assert_the_list_and_console_agree(app, browser, order, ("paid", "Paid"))


def _cancelled_by_the_customer(make_shop, sandbox):
    app = make_shop(sandbox=True)
    browser = Shopper(app)
    placed = browser.place()
    answer = browser.cancel(placed["reference"], placed["version"])
    assert answer.status_code == 200
    # The cancel's JSON answer is the cancelled order's JSON.
    assert set(answer.get_json()) == CANCELLED_KEYS and answer.get_json()["cancelled_because"] == "customer"
    run_everything(app)  # the stock comes back
    return app, browser, placed["reference"]


def _expired(make_shop, sandbox):
    app = make_shop()
    browser = Shopper(app)
    ref = browser.buy()
    pay_by = as_utc(datetime.fromisoformat(browser.order(ref)["pay_by"]))
    run_everything(app, now=pay_by + timedelta(seconds=1))
    return app, browser, ref


def _cancelled_otherwise(make_shop, sandbox):
    app = make_shop()
    browser = Shopper(app)
    ref = browser.buy()
    with app.app_context():
        assert cancel_order(order_id(app, ref), None, reason="withdrawn by the shop").status is CancelStatus.CANCELLED
        db.session.remove()
    return app, browser, ref


@pytest.mark.parametrize(
    ("cancelled", "because", "badge", "words"),
    [
        (_cancelled_by_the_customer, "customer", ("cancelled", "Cancelled"), "You cancelled this order on "),
        (_expired, "expired", ("expired", "Expired"), "We held these items for you until "),
        (_cancelled_otherwise, "other", ("cancelled", "Cancelled"), "This order is cancelled ("),
    ],
    ids=["customer", "expired", "other"],
)
def test_a_cancelled_order_says_why_and_when_as_its_cancel_event_did(
    make_shop, sandbox, cancelled, because, badge, words
):
    app, browser, ref = cancelled(make_shop, sandbox)
    reason, at = last_cancel_event(app, ref)
    order = browser.order(ref)

    assert set(order) == CANCELLED_KEYS
    assert (order["status"], order["cancelled_because"], order["cancelled_at"]) == ("Cancelled", because, at)
    assert reason and order["pay_by"] is None
    html = page(browser, f"/orders/{ref}")
    assert f'<span class="badge {badge[0]}">{badge[1]}</span>' in html and words in html
    assert "Nothing was charged" in html and "Cancel order" not in html
    assert browser.client.get(f"/orders/{ref}/cancel", headers=HTML).status_code == 303
    assert set(assert_the_list_and_console_agree(app, browser, order, badge)) == CONSOLE_KEYS


def test_the_order_page_reads_why_and_when_from_the_order_row_not_its_events(make_shop, sandbox):
    app, browser, ref = _cancelled_otherwise(make_shop, sandbox)
    with app.app_context():
        force_order(ref, cancel_reason="payment window expired", cancelled_at=datetime(2026, 1, 2, 3, 4, 5))
        db.session.remove()

    order = browser.order(ref)

    assert (order["cancelled_because"], order["cancelled_at"]) == ("expired", "2026-01-02T03:04:05Z")
    assert "Expired" in listed(browser, ref)[1]
