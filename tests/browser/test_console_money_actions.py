"""The operator's refund, email-resend and stock-correction pages in a real browser, at a desktop
(1280 px) and a phone (390 px) width: each page passes the accessibility checker (axe-core: nothing
serious or critical), no control sits off the screen on the phone, and each action goes through
from its button (a refund only after its confirmation step)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from browser.layout import log_in_operator, page_problems, sized_page
from browser.test_storefront_pages import WIDTHS
from factories import on_hand
from payment_helpers import Shopper, order_id, run_everything
from shop.extensions import db
from shop.models import EmailResend, Order, Refund, StockCorrection
from shop.payments.apply import reconcile_order
from shop.seed import upsert_operator

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect


def _paid_order(app, sandbox) -> tuple[str, int]:
    order = Shopper(app, app.skus).place("SOCK-M", 2)
    sandbox.set_outcome(order["payment"]["session_id"], "paid")
    oid = order_id(app, order["reference"])
    with app.app_context():
        # The webhook may have applied the payment already; either way the order is paid now.
        assert reconcile_order(oid).outcome in ("paid", "noop")
        assert db.session.get(Order, oid).status == "Paid"
        db.session.remove()
    run_everything(app)  # the confirmation email goes out
    return order["reference"], oid


def _count(app, model, **where) -> int:
    with app.app_context():
        n = len(db.session.execute(select(model).filter_by(**where)).scalars().all())
        db.session.remove()
        return n


@pytest.mark.parametrize("width", WIDTHS)
def test_refund_resend_and_stock_pages_work_and_pass_the_checker_at_both_widths(new_page, shop, sandbox, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    reference, oid = _paid_order(app, sandbox)
    sock = app.skus["SOCK-M"]
    viewport = WIDTHS[width]
    page = sized_page(new_page, width)
    found: dict[str, list] = {}

    def check(name: str) -> None:
        found[name] = page_problems(page, viewport["width"] if width == "phone" else None)

    log_in_operator(page, base_url)

    # Refund: the order page's link, the form, the confirmation step, then the money moves.
    page.goto(f"{base_url}/console/orders/{reference}")
    page.get_by_role("link", name="Refund…").click()
    check("refund form")
    page.get_by_label("Amount to refund").fill("9999")
    page.get_by_label("Why").fill("one sock arrived torn")
    page.get_by_role("button", name="Review the refund").click()
    expect(page.get_by_role("alert")).to_contain_text("more than is left to refund")
    check("refund form with a mistake")
    page.get_by_label("Amount to refund").fill("1.25")
    page.get_by_label("Why").fill("one sock arrived torn")
    page.get_by_label("Units of SOCK-M to put back (at most 2)").fill("1")  # one pair of the two
    page.get_by_role("button", name="Review the refund").click()
    expect(page.get_by_role("heading", name="Refund $1.25?")).to_be_visible()
    expect(page.get_by_text("Stock: put back: 1 × SOCK-M.")).to_be_visible()
    check("refund confirmation")
    assert _count(app, Refund, order_id=oid) == 0
    before = on_hand(sock, app)
    page.get_by_role("button", name="Yes, refund $1.25").click()
    expect(page.locator("p.flash", has_text="Refunding $1.25 to the customer's payment")).to_be_visible()
    expect(page.locator("p.flash")).to_contain_text(f"Put back in stock: 1 × SOCK-M (stock {before} → {before + 1}).")
    check("order after the refund")
    assert _count(app, Refund, order_id=oid) == 1 and on_hand(sock, app) == before + 1
    run_everything(app)  # the provider's answer: the refund succeeded
    page.reload()
    expect(page.locator(".order-head strong", has_text="Partially refunded")).to_be_visible()
    check("order partly refunded")
    with app.app_context():
        access = db.session.get(Order, oid).access_token
        db.session.remove()
    page.goto(f"{base_url}/orders/{reference}?token={access}")
    expect(page.get_by_text("Partially refunded: $1.25 went back to your payment")).to_be_visible()
    check("customer's order partly refunded")
    page.goto(f"{base_url}/console/orders/{reference}")

    # Emails: the order page's link, the list, one sent again.
    page.get_by_role("link", name="Emails sent…").click()
    check("order emails")
    page.get_by_role("link", name="Send the Order confirmation (paid) email again…").click()
    expect(page.get_by_role("heading", name="Send the Order confirmation (paid) email again?")).to_be_visible()
    check("email resend confirmation")
    assert _count(app, EmailResend, order_id=oid) == 0
    page.get_by_role("button", name="Yes, send it again").click()
    expect(page.locator("p.flash", has_text="is on its way to")).to_be_visible()
    assert _count(app, EmailResend, order_id=oid) == 1

    # Stock: from the order's line to the variant's page, corrected with a reason.
    page.goto(f"{base_url}/console/orders/{reference}")
    page.get_by_role("link", name=f"variant {sock}: stock").click()
    check("stock page")
    page.get_by_label("Or adjust by a change").fill("-1")
    page.get_by_label("Why the stock changes").fill("one found damaged")
    page.get_by_label("Adjust this variant's stock").check()
    page.get_by_role("button", name="Adjust the stock").click()
    expect(page.locator("p.flash", has_text=f"Stock of variant {sock} corrected")).to_be_visible()
    expect(page.get_by_role("cell", name="one found damaged")).to_be_visible()
    check("stock page after a correction")
    assert _count(app, StockCorrection, variant_id=sock) == 1
    page.goto(f"{base_url}/console/inventory")
    check("stock list")
    page.goto(f"{base_url}/console/restore-warnings")
    page.get_by_role("link", name="correct the stock").first.click()
    expect(page).to_have_url(f"{base_url}/console/inventory")
    problems = {name: problems for name, problems in found.items() if problems}
    assert problems == {}, "\n".join(f"{n}: {p}" for n, ps in problems.items() for p in ps)
