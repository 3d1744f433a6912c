"""The pages about an order's address in a real browser, at a desktop (1280 px) and a phone
(390 px) width: the checkout's "did you mean", the unpaid-order refusal (this browser's orders a
link away, an address's offered as an email of their links) and the console's change of address
and send-to-another-address. Each passes the accessibility checker (axe-core: nothing serious or
critical), nothing sits off the phone's screen, and each choice goes through from its button."""

from __future__ import annotations

import pytest

from browser.layout import log_in_operator, page_problems, sized_page
from browser.test_console_money_actions import _paid_order
from browser.test_storefront_pages import WIDTHS, add_to_cart, check_out, order_row
from payment_helpers import Shopper
from shop.extensions import db
from shop.seed import upsert_operator

# Over real HTTP, registered with the sandbox; one unpaid order fills a browser's or an address's place.
pytestmark = pytest.mark.shop(served=True, UNPAID_ORDERS_PER_CLIENT=1)

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect


class Checked:
    """The axe check, and at the phone's width the overflow check, of each page looked at."""

    def __init__(self, page, width: str):
        self.page, self.width, self.found = page, width, {}

    def __call__(self, name: str) -> None:
        self.found[name] = page_problems(self.page, WIDTHS["phone"]["width"] if self.width == "phone" else None)

    def assert_clean(self) -> None:
        problems = {name: problems for name, problems in self.found.items() if problems}
        assert problems == {}, "\n".join(f"{n}: {p}" for n, ps in problems.items() for p in ps)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_checkout_hint_and_both_unpaid_refusals_work_and_pass_the_checker(new_page, shop, sandbox, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    base_url = shop.config["PUBLIC_BASE_URL"]
    # The address's one order, from elsewhere, paid at the provider with the news not here yet: a
    # checkout of the address cannot release it (a paid session refuses the cancel), so it refuses.
    elsewhere = Shopper(shop, shop.skus)
    assert elsewhere.checkout("SOCK-M", 1, email="bea@example.com").status_code == 303
    session_id = elsewhere.latest()["payment"]["session_id"]
    sandbox.faults(drop_webhooks=10)
    sandbox.set_outcome(session_id, "paid")
    page = sized_page(new_page, width)
    check = Checked(page, width)
    try:
        # "Did you mean": both choices shown; the suggested one places the order.
        add_to_cart(page, base_url, "SOCK-M", 1)
        check_out(page, "cy@gmial.com")
        expect(page.locator("#email-suggestion")).to_contain_text("Did you mean cy@gmail.com?")
        expect(page.get_by_role("button", name="Keep cy@gmial.com")).to_be_visible()
        check("checkout hint")
        page.get_by_role("button", name="Use cy@gmail.com").click()
        page.wait_for_url(lambda url: "/cart" not in url)
        assert order_row(shop, email="cy@gmail.com").status == "PaymentInitiated"

        # This browser's own unpaid order fills its place: the refusal links to it.
        add_to_cart(page, base_url, "SOCK-M", 1)
        check_out(page, "cy@gmail.com")
        expect(page.locator("#unpaid-limit")).to_contain_text("This browser already has 1 order waiting for payment")
        check("refusal: this browser's orders")
        page.locator("#unpaid-limit").get_by_role("link", name="Your orders").click()
        expect(page).to_have_url(f"{base_url}/orders")

        # Another browser, the address's order placed elsewhere: its links are offered by email.
        page.goto("about:blank")  # no response of the old browser's still on its way to set its cookie again
        page.context.clear_cookies()
        add_to_cart(page, base_url, "SOCK-M", 1)
        check_out(page, "bea@example.com")
        expect(page.locator("#unpaid-limit")).to_contain_text("The address bea@example.com already has 1 order")
        check("refusal: the address's orders")
        page.get_by_role("button", name="Email the links to bea@example.com").click()
        expect(page.locator("p.flash", has_text="If bea@example.com has orders waiting for payment")).to_be_visible()
        check("cart after asking for the links")
    finally:
        page.close()
    check.assert_clean()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_consoles_change_of_address_and_send_to_another_work_and_pass_the_checker(new_page, shop, sandbox, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    base_url = shop.config["PUBLIC_BASE_URL"]
    with shop.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    reference, _oid = _paid_order(shop, sandbox)
    page = sized_page(new_page, width)
    check = Checked(page, width)
    try:
        log_in_operator(page, base_url)

        page.goto(f"{base_url}/console/orders/{reference}")
        page.get_by_role("link", name="Change email…").click()
        check("change email form")
        page.get_by_label("New email").fill("ann.lee@example.org")
        page.get_by_label("Why (optional)").fill("the customer called about a typo")
        page.get_by_role("button", name="Change the email").click()
        expect(page.locator("p.flash", has_text="emails now go to ann.lee@example.org")).to_be_visible()
        check("order after the change")
        assert order_row(shop, reference=reference).email == "ann.lee@example.org"

        page.get_by_role("link", name="Emails sent…").click()
        page.get_by_role("link", name="Send the Order confirmation (paid) email again…").click()
        page.get_by_label("Send to").fill("office@example.net")
        check("send to another address")
        page.get_by_role("button", name="Yes, send it again").click()
        expect(page.locator("p.flash", has_text="is on its way to office@example.net")).to_be_visible()
        assert order_row(shop, reference=reference).email == "ann.lee@example.org"
    finally:
        page.close()
    check.assert_clean()
