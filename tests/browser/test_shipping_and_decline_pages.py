"""The customer's pages around paying, in a real browser at a desktop and a phone width, checked
by axe-core: the sandbox's hosted page asking for a shipping address (and refusing an incomplete
one beside its fields), a declined card told on the order page with the way to try again, and
a paid order showing where it ships. The shop is served over real HTTP and registered with the
sandbox, so the decline and the payment reach it by webhook."""

from __future__ import annotations

import re

import pytest

from browser.test_storefront_pages import WIDTHS, add_to_cart, axe_problems, check_out

pytestmark = pytest.mark.shop(served=True)

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect


@pytest.mark.parametrize("width", WIDTHS)
def test_the_address_form_the_decline_and_the_shipping_address_read_well_and_pass_axe(
    new_page, shop, sandbox, screenshot_dir, width
):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    base_url = shop.config["PUBLIC_BASE_URL"]
    page = new_page(viewport=WIDTHS[width])
    found: dict[str, list[str]] = {}

    def check(name: str) -> None:
        page.wait_for_load_state()
        page.screenshot(path=str(screenshot_dir / f"shipping-{width}-{name.replace(' ', '-')}.png"), full_page=True)
        found[name] = axe_problems(page)
        # Nothing runs off the side of a phone's screen.
        scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client, f"{name}: {scroll}px wide in a {client}px window"

    add_to_cart(page, base_url, "MUG-350-SND", 1)
    check_out(page, "ada@example.com")
    expect(page).to_have_url(re.compile(re.escape(sandbox.base_url) + r"/pay/cs_"))
    pay_url = page.url
    expect(page.get_by_role("group", name="Shipping address")).to_be_visible()
    check("hosted page with the address form")

    # An incomplete address is refused beside its fields, keeping what was typed.
    page.get_by_label("Full name").fill("Ada Lovelace")
    page.get_by_role("button", name=re.compile(r"^Pay \$")).click()
    expect(page.locator("#ship-line1-error")).to_have_text("Address line 1 is required.")
    expect(page.get_by_label("Full name")).to_have_value("Ada Lovelace")
    expect(page.get_by_label("Address line 1")).to_have_attribute("aria-invalid", "true")
    check("hosted page refusing an incomplete address")

    page.get_by_label("Address line 1").fill("12 St James's Square")
    page.get_by_label("City").fill("London")
    page.get_by_label("Postal code").fill("SW1Y 4JH")
    page.get_by_label("Country").select_option("GB")

    # The card is declined: the hosted page says so, and so does the order page.
    page.get_by_role("button", name="Decline").click()
    expect(page.get_by_role("alert")).to_contain_text("Your card was declined")
    order_url = page.get_by_role("link", name="← Back to the shop").get_attribute("href")
    page.goto(order_url)
    expect(page.locator("h1 .badge")).to_have_text("Card declined")
    expect(page.locator(".payment-error")).to_contain_text("Your card was declined.")
    expect(page.get_by_role("link", name="Continue to payment")).to_have_attribute("href", pay_url)
    check("order page after a declined card")

    # Trying again on the same page, with the address, pays; the order shows where it ships.
    page.get_by_role("link", name="Continue to payment").click()
    page.get_by_label("Full name").fill("Ada Lovelace")
    page.get_by_label("Address line 1").fill("12 St James's Square")
    page.get_by_label("City").fill("London")
    page.get_by_label("Postal code").fill("SW1Y 4JH")
    page.get_by_label("Country").select_option("GB")
    page.get_by_role("button", name=re.compile(r"^Pay \$")).click()
    expect(page.locator("h1 .badge")).to_have_text("Paid")
    shipping = page.get_by_role("region", name="Shipping to")
    expect(shipping).to_contain_text("Ada Lovelace")
    expect(shipping).to_contain_text("SW1Y 4JH London")
    check("paid order with its shipping address")

    assert {name: problems for name, problems in found.items() if problems} == {}
