"""The storefront in a real browser: an order page that updates itself while it waits (a payment
settling, the provider unreachable), a refused form that leaves the address bar on a GET page,
a short cart line fixed in one click, and an accessibility check (axe-core) of every page at a
desktop and a phone width."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from payment_helpers import run_due_commands
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import InventoryItem, Order, Variant
from support import wait_until

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect

# Set on the page's window: it survives only while the same document stays (no navigation, no reload).
MARKER = "window.__sameDocument = 'still here'"
MARKER_READ = "window.__sameDocument"


def add_to_cart(page, base_url: str, sku: str, quantity: int) -> None:
    page.goto(f"{base_url}/")
    row = page.locator("section.card tr", has_text=sku)
    row.get_by_label(f"Quantity of {sku}").fill(str(quantity))
    row.get_by_role("button", name="Add to cart").click()
    expect(page).to_have_url(f"{base_url}/cart")


def check_out(page, email: str) -> None:
    page.get_by_label("Email for your receipt").fill(email)
    page.get_by_role("button", name="Check out and pay").click()


def order_row(app, **where) -> Order:
    with app.app_context():
        try:
            order = db.session.execute(select(Order).filter_by(**where).order_by(Order.id.desc()).limit(1)).scalar_one()
            db.session.expunge(order)
            return order
        finally:
            db.session.remove()


def set_stock(app, sku: str, on_hand: int) -> None:
    with app.app_context():
        variant_id = db.session.execute(select(Variant.id).where(Variant.sku == sku)).scalar_one()
        db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == variant_id).values(on_hand=on_hand))
        db.session.commit()
        db.session.remove()


def watch_navigations(page) -> list[str]:
    seen: list[str] = []
    page.on("framenavigated", lambda frame: seen.append(frame.url) if frame == page.main_frame else None)
    return seen


def test_a_settling_payment_turns_to_paid_on_the_open_order_page_without_a_reload(page, shop, sandbox):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    add_to_cart(page, base_url, "NB-A5-DOT", 1)
    check_out(page, "ann@example.com")
    expect(page).to_have_url(re.compile(re.escape(sandbox.base_url) + r"/pay/cs_"))
    session_id = re.search(r"/pay/(cs_[A-Za-z0-9_]+)", page.url).group(1)

    # The customer chose a payment method that settles later: checkout completes, money does not.
    sandbox.set_outcome(session_id, "async_pending")
    wait_until(
        lambda: order_row(app, payment_session_id=session_id).payment_processing_at,
        timeout=15,
        what="the shop to learn the payment is processing",
    )
    reference = order_row(app, payment_session_id=session_id).reference
    page.goto(f"{base_url}/orders/{reference}")
    expect(page.locator("h1 .badge")).to_have_text("Payment processing")
    expect(page.locator(".lead")).to_contain_text("Your payment is being processed")
    page.evaluate(MARKER)
    navigations = watch_navigations(page)

    sandbox.async_result(session_id, "succeeded")

    expect(page.locator("h1 .badge")).to_have_text("Paid")
    expect(page.locator(".lead")).to_contain_text("Thank you!")
    expect(page.get_by_role("link", name="Cancel order")).to_have_count(0)
    assert page.evaluate(MARKER_READ) == "still here" and navigations == []
    assert page.url == f"{base_url}/orders/{reference}"


def test_an_order_left_unpaid_by_an_unreachable_provider_shows_its_expiry_without_a_reload(page, shop, sandbox):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    add_to_cart(page, base_url, "NB-A5-DOT", 1)
    sandbox.faults(api_unavailable=True)
    check_out(page, "bo@example.com")
    expect(page).to_have_url(re.compile(re.escape(base_url) + r"/orders/BK-"))
    expect(page.locator("h1 .badge")).to_have_text("Awaiting payment")
    expect(page.get_by_role("button", name="Pay now")).to_be_visible()
    sandbox.faults(api_unavailable=False)
    page.evaluate(MARKER)
    navigations = watch_navigations(page)

    run_due_commands(app, utcnow() + timedelta(seconds=app.config["UNPAID_ORDER_EXPIRY_SECONDS"] + 5))

    expect(page.locator("h1 .badge")).to_have_text("Expired")
    expect(page.locator(".lead")).to_contain_text("no payment arrived by then")
    expect(page.get_by_role("button", name="Pay now")).to_have_count(0)
    assert page.evaluate(MARKER_READ) == "still here" and navigations == []


def test_a_refused_checkout_leaves_the_browser_on_the_cart_with_the_error_beside_the_email(page, shop):
    base_url = shop.config["PUBLIC_BASE_URL"]
    add_to_cart(page, base_url, "NB-A5-DOT", 1)
    # The browser's own check lets this through; the shop's does not (no dot in the domain).
    with page.expect_response(lambda r: r.request.method == "POST") as refused:
        check_out(page, "ann@localhost")
    assert refused.value.status == 400 and refused.value.url == f"{base_url}/checkout"

    expect(page).to_have_url(f"{base_url}/cart")
    email = page.get_by_label("Email for your receipt")
    expect(email).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#email-error")).to_contain_text("does not look like an email address")
    expect(page.locator("p.flash.error")).to_have_count(0)  # beside the field, not in a banner

    # A reload asks for the cart again; nothing is posted twice.
    with page.expect_response(lambda r: r.url == f"{base_url}/cart") as reloaded:
        page.reload()
    assert reloaded.value.request.method == "GET" and reloaded.value.status == 200


def test_a_cart_line_over_what_is_left_is_marked_and_reduce_fixes_it_in_one_click(page, shop):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    add_to_cart(page, base_url, "MUG-350-NVY", 3)
    set_stock(app, "MUG-350-NVY", 1)  # sold elsewhere meanwhile
    page.reload()

    line = page.locator("table.lines tbody tr", has_text="MUG-350-NVY")
    expect(line).to_contain_text("Only 1 left")
    expect(page.get_by_role("button", name="Check out and pay")).to_be_disabled()
    expect(page.get_by_role("alert")).to_have_count(1)
    line.get_by_role("button", name="Reduce to 1").click()

    expect(page).to_have_url(f"{base_url}/cart")
    expect(line.locator("input[name=quantity]")).to_have_value("1")
    expect(line).not_to_contain_text("Only 1 left")
    expect(page.get_by_role("button", name="Check out and pay")).to_be_enabled()


# -- accessibility ------------------------------------------------------------------------------

WIDTHS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


def axe_problems(page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now, in words."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}) at {node['target']}: {node['any'][0]['message'] if node['any'] else v['help']}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
        for node in v["nodes"]
    ]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_storefront_page_passes_the_accessibility_checker(new_page, shop, sandbox, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    page = new_page(viewport=WIDTHS[width])
    found: dict[str, list[str]] = {}

    def check(name: str) -> None:
        page.wait_for_load_state()
        found[name] = axe_problems(page)

    page.goto(f"{base_url}/")
    check("catalog")
    # Keyboard focus shows (axe does not check it): the first Tab lands on a link with an outline.
    page.keyboard.press("Tab")
    outline = page.evaluate(
        "(() => { const s = getComputedStyle(document.activeElement);"
        " return [document.activeElement.tagName, s.outlineStyle, s.outlineWidth]; })()"
    )
    assert outline[0] == "A" and outline[1] != "none" and outline[2] != "0px", outline
    page.goto(f"{base_url}/cart")
    check("empty cart")
    page.goto(f"{base_url}/orders")
    check("no orders")
    page.goto(f"{base_url}/no-such-page")
    check("404 page")
    page.goto(f"{base_url}/orders/BK-NOSUCH")
    check("404 order")

    set_stock(app, "MUG-350-SND", 0)
    page.goto(f"{base_url}/")
    check("catalog with a sold-out item")
    add_to_cart(page, base_url, "NB-A5-DOT", 1)
    check("cart")
    add_to_cart(page, base_url, "MUG-350-NVY", 2)
    set_stock(app, "MUG-350-NVY", 1)
    page.reload()
    check("cart with a short line")
    page.get_by_role("button", name="Remove Enamel Camp Mug – Navy").click()
    check_out(page, "ann@localhost")
    expect(page.locator("#email-error")).to_be_visible()
    check("refused checkout")

    # Provider unreachable: the order waits for "Pay now".
    sandbox.faults(api_unavailable=True)
    check_out(page, "ann@example.com")
    expect(page.locator("h1 .badge")).to_have_text("Awaiting payment")
    check("order awaiting payment")
    order_url = page.url
    sandbox.faults(api_unavailable=False)

    page.get_by_role("button", name="Pay now").click()
    expect(page).to_have_url(re.compile(re.escape(sandbox.base_url) + r"/pay/cs_"))
    session_id = re.search(r"/pay/(cs_[A-Za-z0-9_]+)", page.url).group(1)
    page.goto(order_url)
    expect(page.locator("h1 .badge")).to_have_text("At the payment page")
    check("order at the payment page")

    sandbox.set_outcome(session_id, "async_pending")
    page.goto(order_url)
    expect(page.locator("h1 .badge")).to_have_text("Payment processing")
    check("order with a payment processing")
    sandbox.async_result(session_id, "failed")
    expect(page.locator("h1 .badge")).to_have_text("Payment failed")
    check("order whose payment failed")

    page.get_by_role("button", name="Pay now").click()
    expect(page).to_have_url(re.compile(re.escape(sandbox.base_url) + r"/pay/cs_"))
    session_id = re.search(r"/pay/(cs_[A-Za-z0-9_]+)", page.url).group(1)
    sandbox.set_outcome(session_id, "paid")
    page.goto(order_url)
    expect(page.locator("h1 .badge")).to_have_text("Paid")
    check("paid order")

    add_to_cart(page, base_url, "SOCK-M", 1)
    check_out(page, "ann@example.com")
    expect(page).to_have_url(re.compile(re.escape(sandbox.base_url) + r"/pay/cs_"))
    page.goto(f"{base_url}/orders")
    page.get_by_role("link", name=re.compile("^BK-")).first.click()
    page.get_by_role("link", name="Cancel order").click()
    check("cancel confirmation")
    page.get_by_role("button", name="Yes, cancel the order").click()
    expect(page.locator("h1 .badge")).to_have_text("Cancelled")
    check("cancelled order")

    page.goto(f"{base_url}/orders")
    check("orders list")

    problems = {name: issues for name, issues in found.items() if issues}
    assert problems == {}, "\n".join(f"{name}: {issue}" for name, issues in problems.items() for issue in issues)
    assert len(found) == 17  # every page state above was reached and checked
