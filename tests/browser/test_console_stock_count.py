"""The stock page's shelf count in a real browser, at a desktop (1280 px) and a phone (390 px)
width: the page shows what the shelf should hold, a checkout made between the page and the save
brings the form back with the new figures and the operator's count and reason kept, "Set it
anyway" saves the count against them, and every page passes the accessibility checker (axe-core:
nothing serious or critical) with no control off the screen on the phone."""

from __future__ import annotations

import pytest

from browser.layout import log_in_operator, page_problems, sized_page
from browser.test_storefront_pages import WIDTHS
from payment_helpers import Shopper
from shop.extensions import db
from shop.models import InventoryItem, StockCorrection
from shop.orders.stock_held import held_by_orders
from shop.seed import upsert_operator

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect


def _figures(app, variant) -> tuple[int, int]:
    with app.app_context():
        figures = db.session.get(InventoryItem, variant).on_hand, held_by_orders(variant).total
        db.session.remove()
        return figures


@pytest.mark.parametrize("width", WIDTHS)
def test_a_shelf_count_met_by_a_checkout_comes_back_and_is_set_anyway_at_both_widths(new_page, shop, sandbox, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    sock = app.skus["SOCK-M"]
    Shopper(app, app.skus).place("SOCK-M", 2)  # an unpaid order holds two on the shelf
    viewport = WIDTHS[width]
    page = sized_page(new_page, width)
    found: dict[str, list] = {}

    def check(name: str) -> None:
        found[name] = page_problems(page, viewport["width"] if width == "phone" else None)

    try:
        log_in_operator(page, base_url)

        page.goto(f"{base_url}/console/inventory/{sock}")
        on_hand, held = _figures(app, sock)
        assert held >= 2
        expect(page.locator("#figure-shelf")).to_have_text(str(on_hand + held))
        check("stock page with its shelf figures")
        Shopper(app, app.skus).place("SOCK-M", 1)  # a checkout between the page and the save
        shelf = on_hand + held - 1  # one unit is missing from the shelf
        page.get_by_label("How many are on the shelf").fill(str(shelf))
        page.get_by_label("Why the shelf was counted").fill("one sock missing at the count")
        page.get_by_label("Set this variant's stock from the shelf count").check()
        page.get_by_role("button", name="Set from the count").click()

        expect(page.get_by_role("alert")).to_contain_text("The stock changed while you were looking")
        expect(page.get_by_label("How many are on the shelf")).to_have_value(str(shelf))
        expect(page.get_by_label("Why the shelf was counted")).to_have_value("one sock missing at the count")
        expect(page.locator("#figure-on-hand")).to_have_text(str(on_hand - 1))
        check("stock count refused by a checkout")
        assert _figures(app, sock) == (on_hand - 1, held + 1)  # the checkout stands

        page.get_by_role("button", name="Set it anyway").click()
        expect(page.locator("p.flash", has_text=f"set from a shelf count of {shelf}")).to_be_visible()
        check("stock page after the count")
        assert _figures(app, sock) == (shelf - held - 1, held + 1)
        with app.app_context():
            modes = [c.mode for c in db.session.query(StockCorrection).filter_by(variant_id=sock)]
            db.session.remove()
        assert modes[-1] == "count"
    finally:
        page.close()
    problems = {name: problems for name, problems in found.items() if problems}
    assert problems == {}, "\n".join(f"{n}: {p}" for n, ps in problems.items() for p in ps)
