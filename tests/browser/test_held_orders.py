"""Capture at dispatch in a real browser, at a desktop (1280 px) and a phone (390 px) width
(docs/REFERENCE.md, Console: GET /console/shipping, GET/POST /console/orders/<ref>/ship and
/cancel): the list of held orders to ship, the ship action through its confirmation step with a
tracking number, the operator's cancel of an Authorized order, and the customer's order page
once shipped. Every page passes the accessibility checker (axe-core: nothing serious or
critical) and, on the phone, fits its screen; each action goes through from its button."""

from __future__ import annotations

import pytest

from browser.layout import log_in_operator, page_problems, sized_page
from browser.test_storefront_pages import WIDTHS
from payment_helpers import Shopper, order_id, run_everything
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import Order, Refund
from shop.payments.apply import reconcile_order
from shop.provider import gateway
from shop.seed import upsert_operator

pytestmark = pytest.mark.shop(served=True, CAPTURE_MODE="dispatch")

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect


def _authorized(app, sandbox) -> str:
    """One order of a SOCK-M whose card payment the sandbox holds, applied: its reference."""
    order = Shopper(app, app.skus).place("SOCK-M", 1)
    assert sandbox.set_outcome(order["payment"]["session_id"], "paid")["payment_status"] == "unpaid"
    with app.app_context():
        # The webhook may have applied the hold already; either way the order is Authorized now.
        assert reconcile_order(order_id(app, order["reference"])).outcome in ("authorized", "noop")
        db.session.remove()
    return order["reference"]


def _order(app, reference: str) -> tuple[OrderStatus, str, str | None]:
    """The order's state, its customer's private link token and its payment's state at the sandbox."""
    with app.app_context():
        row = db.session.query(Order).filter_by(reference=reference).one()
        session = gateway.retrieve_session(row.payment_session_id)
        found = (OrderStatus(row.status), row.access_token, gateway.retrieve_payment(session.payment_intent).status)
        db.session.remove()
    return found


@pytest.mark.parametrize("width", WIDTHS)
def test_held_orders_are_listed_shipped_with_tracking_and_cancelled_from_their_buttons_at_both_widths(
    new_page, shop, sandbox, screenshot_dir, width
):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    to_ship, to_cancel = _authorized(app, sandbox), _authorized(app, sandbox)
    page = sized_page(new_page, width)
    phone = WIDTHS[width]["width"] if width == "phone" else None
    found: dict[str, list] = {}

    def check(name: str, on=None) -> None:
        on = on or page
        found[name] = page_problems(on, phone)
        on.screenshot(path=str(screenshot_dir / f"held-{width}-{name.replace(' ', '-')}.png"), full_page=True)

    log_in_operator(page, base_url)

    # A held order's page: the money is held, not taken; it may be shipped or cancelled.
    page.goto(f"{base_url}/console/orders/{to_ship}")
    summary = page.locator("#money-summary")
    expect(summary.locator("div", has_text="Held, not taken")).to_contain_text("$22.00")
    expect(summary.locator("div", has_text="Paid")).to_contain_text("$0.00")
    check("held order")

    # The list: both held orders, the one authorized first on top, each with its ship link.
    page.get_by_role("link", name="To ship").click()
    rows = page.locator("#to-ship tr", has=page.get_by_role("link", name="Ship…"))
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text(to_ship)
    expect(rows.nth(1)).to_contain_text(to_cancel)
    check("held orders to ship")

    # Ship: the confirmation step says the hold is captured first; a GET moves nothing.
    rows.nth(0).get_by_role("link", name="Ship…").click()
    expect(page.get_by_role("heading", name="Did these items leave?")).to_be_visible()
    expect(page.get_by_text("captures the payment held for this order first")).to_be_visible()
    check("ship confirmation of a held order")
    assert _order(app, to_ship)[0] is OrderStatus.AUTHORIZED
    page.get_by_label("Tracking number (optional)").fill("1Z 999 AA1")
    page.get_by_role("button", name="Yes, it shipped").click()
    expect(page.locator("p.flash")).to_be_visible()
    # While its capture is under way the order offers neither a cancel (it would be refused) nor a
    # second ship: it says it is being shipped.
    tools = page.locator(".order-tools")
    expect(tools).to_contain_text("being shipped: its held payment is being captured")
    expect(tools.get_by_role("link", name="Cancel…")).to_have_count(0)
    expect(tools.get_by_role("link", name="Ship…")).to_have_count(0)
    check("held order after the ship")
    run_everything(app)  # the capture command takes the hold, then the order is Paid and shipped
    status, token, payment = _order(app, to_ship)
    assert (status, payment) == (OrderStatus.PAID, gateway.PaymentIntentStatus.SUCCEEDED)
    page.reload()
    expect(page.get_by_text("tracking 1Z 999 AA1")).to_be_visible()
    check("shipped order")
    page.get_by_role("link", name="To ship").click()
    expect(page.locator("#to-ship tr", has_text=to_ship)).to_have_count(0)
    expect(page.locator("#to-ship tr", has_text=to_cancel)).to_have_count(1)

    # Cancel: the confirmation step says the hold is voided, not refunded; a reason is asked.
    page.goto(f"{base_url}/console/orders/{to_cancel}")
    page.get_by_role("link", name="Cancel…").click()
    expect(page.get_by_text("nothing is taken, nothing refunded")).to_be_visible()
    check("cancel confirmation of a held order")
    page.get_by_label("Why").fill("the customer asked by phone")
    page.get_by_role("button", name="Yes, cancel the order").click()
    expect(page.locator("p.flash")).to_be_visible()
    check("held order after the cancel")
    run_everything(app)  # the void and the compensation
    page.reload()
    # Voided, not taken: nothing paid, nothing kept.
    expect(page.locator("#money-summary div", has_text="Net")).to_contain_text("$0.00")
    expect(page.locator("#money-summary")).not_to_contain_text("Held")
    assert _order(app, to_cancel)[0::2] == (OrderStatus.CANCELLED, gateway.PaymentIntentStatus.CANCELED)
    with app.app_context():
        assert db.session.query(Refund).count() == 0
        db.session.remove()
    page.get_by_role("link", name="To ship").click()
    expect(page.get_by_text("Nothing to ship")).to_be_visible()
    check("nothing left to ship")

    # The customer's page of the shipped order: when it shipped and its tracking number.
    customer = sized_page(new_page, width)
    customer.goto(f"{base_url}/orders/{to_ship}?token={token}")
    expect(customer.locator("h1 .badge")).to_have_text("Paid")
    expect(customer.locator(".shipped")).to_contain_text("Shipped on")
    expect(customer.locator(".shipped .tracking")).to_have_text("1Z 999 AA1")
    check("customer's shipped order", customer)
    problems = {name: problems for name, problems in found.items() if problems}
    assert problems == {}, "\n".join(f"{n}: {p}" for n, ps in problems.items() for p in ps)
