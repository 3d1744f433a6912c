"""The console in the shop's words, in a real browser at 1280 and 390 px: an order refunded from the
console shows its money summary and its refunds above its lines, the machinery's rows behind a
closed "Technical detail" toggle, its history in words, and each time in UTC with the browser's
local time beside it; the list says states as the customer reads them, and the audit says how the
refund went, not its HTTP status. axe-core finds nothing serious on any of the three pages."""

from __future__ import annotations

import pytest

from browser.layout import log_in_operator, sized_page
from browser.test_console_money_actions import _paid_order
from browser.test_console_phone import OVERFLOW
from browser.test_storefront_pages import WIDTHS, axe_problems
from payment_helpers import run_everything
from shop.extensions import db
from shop.seed import upsert_operator

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect

# Codes the pages used to show where words belong (the JSON keeps them).
CODES = ["OrderPaid", "OrderPlaced", "PaymentInitiated", "send_order_confirmation: done", " armed"]


@pytest.mark.parametrize("width", WIDTHS)
def test_the_order_list_and_audit_pages_say_words_and_pass_axe(new_page, shop, sandbox, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    reference, _ = _paid_order(app, sandbox)
    viewport = WIDTHS[width]
    page = sized_page(new_page, width)
    found: dict[str, list] = {}

    def check(name: str) -> None:
        page.wait_for_load_state()
        problems = axe_problems(page)
        if width == "phone":
            layout = page.evaluate(OVERFLOW, viewport["width"])
            scroll_width, client_width = layout["doc"]
            if scroll_width > client_width:
                problems.append(f"page {scroll_width} px wide on a {client_width} px screen")
            problems += [f"off screen: {o}" for o in layout["out"][:5]]
        shown = page.locator("main").inner_text()  # a filter's option keeps the code as its value
        problems += [f"shows the code {code!r}" for code in CODES if code in shown]
        found[name] = problems

    log_in_operator(page, base_url)

    # A refund of $1.25 from the console (its form is used as it is), sent to the provider.
    page.goto(f"{base_url}/console/orders/{reference}")
    page.get_by_role("link", name="Refund…").click()
    page.get_by_label("Amount to refund").fill("1.25")
    page.get_by_label("Why").fill("one sock arrived torn")
    page.get_by_role("button", name="Review the refund").click()
    page.get_by_role("button", name="Yes, refund $1.25").click()
    expect(page.locator("p.flash", has_text="Refunding $1.25")).to_be_visible()
    run_everything(app)

    page.goto(f"{base_url}/console/orders/{reference}")
    summary = page.locator("#money-summary")
    expect(summary).to_contain_text("Refunded")
    text = summary.inner_text()
    assert "Paid" in text and "$1.25" in text and "Net" in text, text
    refunds = page.get_by_role("heading", name="Refunds")
    expect(refunds).to_be_visible()
    expect(page.locator("main")).to_contain_text("money returned")  # the refund's status, in words
    assert refunds.bounding_box()["y"] < page.locator("#lines").bounding_box()["y"]
    technical = page.locator("#technical-detail")
    assert technical.get_attribute("open") is None  # nothing dead: the machinery's rows stay folded
    deliveries = technical.get_by_role("cell", name="Email the order confirmation send_order_confirmation")
    expect(deliveries).to_be_hidden()
    page.locator("#technical-detail > summary").click()
    expect(deliveries).to_be_visible()
    timeline = page.locator("table.timeline").inner_text()
    assert "Order placed" in timeline and "Payment page opened" in timeline, timeline
    stamp = page.locator("table.timeline time").first
    assert stamp.get_attribute("datetime")
    expect(stamp).to_contain_text("UTC (")  # the script put the local time beside the UTC text
    assert stamp.inner_text().endswith("here)"), stamp.inner_text()
    check("order")

    page.goto(f"{base_url}/console/orders")
    expect(page.get_by_role("link", name=reference)).to_be_visible()
    row = page.get_by_role("row").filter(has_text=reference)
    expect(row).to_contain_text("Paid")
    expect(page.get_by_label("Status")).to_contain_text("At the payment page")
    check("orders")

    page.goto(f"{base_url}/console/audit")
    row = page.get_by_role("row").filter(has_text="refund").filter(has_text=reference)
    expect(row).to_contain_text("done")
    assert "303" not in row.inner_text(), row.inner_text()
    check("audit")
    assert found == {name: [] for name in found}, found
