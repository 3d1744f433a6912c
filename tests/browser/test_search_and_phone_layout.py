"""The console's search and CSV download, and what a tester found at 390 px, in a real browser at a
desktop (1280 px) and a phone (390 px) width: the dashboard's red card comes first, a table's action
buttons are on the screen without scrolling sideways, a filter that cannot be read is said whole
beside the form, a refused cart quantity is shown whole with its box and the totals on screen; and
axe-core finds nothing serious on any of these pages."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from factories import force_order
from payment_helpers import Shopper
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import InventoryItem, Order, OutboxDelivery, Refund, ScheduledCommand, Variant
from shop.seed import upsert_operator

from .test_console_phone import OVERFLOW
from .test_storefront_pages import WIDTHS, add_to_cart, axe_problems

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect


# The box of an element as the reader sees it: its right edge on the screen, and whether its own
# text is cut off inside it (text wider than the box, with the overflow hidden or scrolled).
BOX = """(el) => {
  const r = el.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, clipped: el.scrollWidth > el.clientWidth + 1};
}"""


def on_screen(locator, width: int) -> None:
    box = locator.evaluate(BOX)
    assert box["left"] >= -1 and box["right"] <= width + 1, box
    assert not box["clipped"], box


def fits(page, width: int, where: str) -> None:
    found = page.evaluate(OVERFLOW, width)
    scroll_width, client_width = found["doc"]
    assert scroll_width <= client_width, (where, found)
    assert not found["out"], (where, found["out"][:10])
    assert not found["narrow"], (where, found["narrow"][:10])


def seed_console(app, sandbox) -> str:
    """A stuck order (a red card), a dead delivery, a failed refund and a long email; returns the
    stuck order's reference."""
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    sandbox.faults(api_unavailable=True)
    shopper = Shopper(app, app.skus)
    shopper.checkout("SOCK-M", 1)
    shopper.checkout("NB-A5-DOT", 1)
    sandbox.faults(api_unavailable=False)
    with app.app_context():
        first, second = db.session.execute(select(Order).order_by(Order.id)).scalars().all()
        force_order(first.id, updated_at=utcnow() - timedelta(hours=2), email="ann.lee@example.com")
        force_order(second.id, email="a.customer.with.a.very.long.address@subdomain.example.com")
        dead = dict(status="dead", last_error="RuntimeError: mail server down")
        db.session.execute(update(OutboxDelivery).values(**dead))
        db.session.execute(update(ScheduledCommand).where(ScheduledCommand.order_id == second.id).values(**dead))
        db.session.add(
            Refund(
                order_id=first.id,
                session_id="cs_test_refund",
                amount=first.total,
                currency=first.currency,
                reason="late money",
                status="failed",
                failure_reason="expired_or_canceled_card",
                last_error="the card was closed",
            )
        )
        reference = first.reference
        db.session.commit()
        db.session.remove()
    return reference


def log_in(page, base_url: str) -> None:
    page.goto(f"{base_url}/console/login")
    page.get_by_label("Email").fill("ops@example.com")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/console/")


@pytest.mark.parametrize("width", WIDTHS)
def test_console_search_csv_and_actions_fit_the_screen(new_page, shop, sandbox, screenshot_dir, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    wide = WIDTHS[width]["width"]
    reference = seed_console(app, sandbox)
    page = new_page(viewport=WIDTHS[width], is_mobile=width == "phone", accept_downloads=True)
    found: dict[str, list[str]] = {}

    def check(name: str) -> None:
        page.wait_for_load_state()
        page.screenshot(path=str(screenshot_dir / f"search-{width}-{name}.png"), full_page=True)
        fits(page, wide, name)
        found[name] = axe_problems(page)

    log_in(page, base_url)
    # The dashboard: every card that needs a human comes before every green one.
    tiles = page.locator("section.tile")
    classes = [tiles.nth(i).get_attribute("class") for i in range(tiles.count())]
    reds = [i for i, c in enumerate(classes) if "alert" in c.split()]
    assert reds and reds == list(range(len(reds))), classes
    check("dashboard")

    # Search: part of an email, a date range and an amount, in the form and kept while paging.
    page.goto(f"{base_url}/console/orders")
    page.get_by_label("Find").fill("ANN.LEE")
    today = utcnow().date().isoformat()
    page.get_by_label("Placed from").fill(today)
    page.get_by_label("Amount from").fill("1")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("table.console-table tbody tr, table.console-table tr:has(td)")).to_have_count(1)
    expect(page.get_by_role("link", name=reference)).to_be_visible()
    check("orders found")

    with page.expect_download() as downloaded:
        page.get_by_role("link", name="Download CSV").click()
    download = downloaded.value
    assert download.suggested_filename.startswith("orders-") and download.suggested_filename.endswith(".csv")
    with open(download.path(), encoding="utf-8") as saved:
        rows = list(csv.reader(io.StringIO(saved.read())))
    assert rows[0][:3] == ["reference", "status", "total"] and [r[0] for r in rows[1:]] == [reference]

    # A filter that cannot be read: said whole, beside the form, with what was typed kept.
    page.goto(f"{base_url}/console/orders?from=2026-13-01&amount_min=-5&q=ann")
    errors = page.locator("#filter-errors")
    expect(errors).to_contain_text("The start date “2026-13-01” is not a date")
    expect(errors).to_contain_text("Lowest amount “-5” is negative")
    for item in errors.locator("li").all():
        on_screen(item, wide)
    expect(page.get_by_label("Find")).to_have_value("ann")
    check("orders with unreadable filters")

    # Lists with buttons: the buttons are on the screen without scrolling the table sideways.
    page.goto(f"{base_url}/console/refunds?status=failed")
    on_screen(page.get_by_role("button", name="Retry"), wide)
    on_screen(page.get_by_role("button", name="Settled outside the shop"), wide)
    check("failed refunds")
    page.goto(f"{base_url}/console/outbox?status=dead")
    on_screen(page.get_by_role("button", name="Retry").first, wide)
    on_screen(page.get_by_role("link", name="Discard…").first, wide)
    check("dead letters")
    page.goto(f"{base_url}/console/orders/{reference}")
    check("order")
    page.goto(f"{base_url}/console/webhooks?q=checkout")
    check("webhooks searched")

    problems = {name: issues for name, issues in found.items() if issues}
    assert problems == {}, "\n".join(f"{name}: {issue}" for name, issues in problems.items() for issue in issues)
    assert len(found) == 7


@pytest.mark.parametrize("width", WIDTHS)
def test_a_refused_cart_quantity_is_shown_whole_beside_its_box_and_the_totals(new_page, shop, screenshot_dir, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    wide = WIDTHS[width]["width"]
    page = new_page(viewport=WIDTHS[width], is_mobile=width == "phone")
    add_to_cart(page, base_url, "MUG-350-NVY", 1)
    with app.app_context():  # sold elsewhere meanwhile: 2 left, the customer asks for 5
        variant = db.session.execute(select(Variant.id).where(Variant.sku == "MUG-350-NVY")).scalar_one()
        db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == variant).values(on_hand=2))
        db.session.commit()
        db.session.remove()
    box = page.get_by_label("Quantity of Enamel Camp Mug – Navy", exact=True)
    assert box.get_attribute("max") == str(app.config["MAX_LINE_QUANTITY"])
    box.fill("5")
    with page.expect_response(lambda r: r.request.method == "POST") as refused:
        page.get_by_role("button", name="Update the quantity of Enamel Camp Mug – Navy").click()
    assert refused.value.status == 409

    message = page.locator(f"#quantity-{variant}-error")
    expect(message).to_have_text("Only 2 of Enamel Camp Mug – Navy left; you asked for 5.")
    expect(page.get_by_role("alert").filter(has_text="you asked for 5")).to_have_count(1)  # said once
    page.screenshot(path=str(screenshot_dir / f"cart-{width}-refused-quantity.png"), full_page=True)
    on_screen(message, wide)
    on_screen(page.get_by_label("Quantity of Enamel Camp Mug – Navy", exact=True), wide)
    on_screen(page.locator("table.lines tfoot td.num"), wide)
    fits(page, wide, "cart")
    assert axe_problems(page) == []
