"""What a customer and an operator see in a real browser: the storefront, the sandbox's hosted
payment page and the console, over real HTTP, with the webhook registered as in production.

Each test leaves one full-page screenshot in the `screenshot_dir` folder."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from factories import on_hand
from payment_helpers import Shopper, wait_for_status
from shop.extensions import db
from shop.models import OutboxDelivery, WebhookReceipt
from shop.outbox.dispatch import run_delivery
from shop.seed import upsert_operator

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect


def catalog_row(page, sku: str):
    return page.locator("section.card tr", has_text=sku)


def stock_shown(page, base_url: str, sku: str) -> str:
    page.goto(f"{base_url}/")
    return catalog_row(page, sku).locator(".stock, .out").inner_text()


def add_to_cart(page, sku: str, quantity: int) -> None:
    row = catalog_row(page, sku)
    row.get_by_label(f"Quantity of {sku}").fill(str(quantity))
    row.get_by_role("button", name="Add to cart").click()
    expect(page).to_have_url(re.compile(r"/cart$"))


def check_out(page, email: str) -> None:
    page.get_by_label("Email for your receipt").fill(email)
    page.get_by_role("button", name="Check out and pay").click()


def watch_for_policy_violations(page) -> list[str]:
    """Every Content-Security-Policy refusal chromium reports on this page, as it reports them
    (console messages "Refused to ... because it violates ... Content Security Policy")."""
    refused = []
    page.on(
        "console", lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None
    )
    return refused


def run_pending_deliveries(app) -> list[str]:
    """What a worker would do: run every pending outbox delivery, in-process."""
    with app.app_context():
        ids = (
            db.session.execute(
                select(OutboxDelivery.id).where(OutboxDelivery.status == "pending").order_by(OutboxDelivery.id)
            )
            .scalars()
            .all()
        )
        db.session.remove()
        return [run_delivery(i) for i in ids]


def test_a_customer_pays_at_the_hosted_page_and_comes_back_to_a_paid_order(page, shop, sandbox, screenshot_dir):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    refused = watch_for_policy_violations(page)
    # The provider's webhooks never arrive: the customer's own return must be enough.
    sandbox.faults(drop_webhooks=10)
    assert stock_shown(page, base_url, "NB-A5-DOT") == "40 in stock"

    add_to_cart(page, "NB-A5-DOT", 2)
    expect(page.locator(".flash")).to_contain_text("Added 2 × Field Notebook – A5, dot grid")
    cart_line = page.locator("table.lines tbody tr", has_text="NB-A5-DOT")
    expect(cart_line.locator("input[name=quantity]")).to_have_value("2")
    expect(page.locator("table.lines tfoot")).to_contain_text("$28.00")
    # The stepper: three, then back to two.
    for quantity, total in (("3", "$42.00"), ("2", "$28.00")):
        cart_line.locator("input[name=quantity]").fill(quantity)
        cart_line.get_by_role("button", name="Update").click()
        expect(page.locator("table.lines tfoot")).to_contain_text(total)

    # The checkout form's 303 to the provider's page passes the pages' form-action policy.
    check_out(page, "ann@example.com")
    expect(page).to_have_url(re.compile(re.escape(sandbox.base_url) + r"/pay/cs_"))
    expect(page.locator("tr.total")).to_contain_text("$28.00")
    # Notebooks ship: the payment page asks where to.
    page.get_by_label("Full name").fill("Ann Example")
    page.get_by_label("Address line 1").fill("1 Main Street")
    page.get_by_label("City").fill("Springfield")
    page.get_by_label("Postal code").fill("12345")

    with page.expect_navigation(url=re.compile(r"/orders/")) as arrived:
        page.get_by_role("button", name="Pay $28.00").click()
    hops = []
    request = arrived.value.request
    while request is not None:
        hops.append(request.url)
        request = request.redirected_from
    assert any(url.startswith(f"{base_url}/checkout/return?") for url in hops), hops

    expect(page.locator("h1 .badge")).to_have_text("Paid")
    expect(page.locator(".lead")).to_contain_text("Thank you!")
    expect(page.get_by_role("region", name="Shipping to")).to_contain_text("1 Main Street")
    expect(page.get_by_role("link", name="Cancel order")).to_have_count(0)
    page.screenshot(path=screenshot_dir / "customer_paid_order.png", full_page=True)
    assert refused == []

    with app.app_context():
        assert db.session.scalar(select(func.count()).select_from(WebhookReceipt)) == 0
        db.session.remove()
    assert stock_shown(page, base_url, "NB-A5-DOT") == "38 in stock"


def test_a_customer_who_leaves_the_hosted_page_cancels_and_the_stock_comes_back(page, shop, sandbox, screenshot_dir):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    refused = watch_for_policy_violations(page)
    assert stock_shown(page, base_url, "MUG-350-NVY") == "3 in stock"

    add_to_cart(page, "MUG-350-NVY", 3)
    check_out(page, "bo@example.com")
    expect(page).to_have_url(re.compile(re.escape(sandbox.base_url) + r"/pay/cs_"))
    page.get_by_role("link", name="Back to the shop").click()

    expect(page.locator("h1 .badge")).to_have_text("At the payment page")
    expect(page.get_by_role("link", name="Continue to payment")).to_be_visible()
    # Cancel asks first, on a page of its own; "No" changes nothing.
    page.get_by_role("link", name="Cancel order").click()
    expect(page.get_by_role("heading", name=re.compile(r"Cancel order BK-\w+\?"))).to_be_visible()
    page.get_by_role("link", name="No, keep it").click()
    expect(page.locator("h1 .badge")).to_have_text("At the payment page")
    page.get_by_role("link", name="Cancel order").click()
    page.get_by_role("button", name="Yes, cancel the order").click()
    expect(page.locator("h1 .badge")).to_have_text("Cancelled")
    expect(page.locator(".flash")).to_contain_text("cancelled and nothing was charged")
    expect(page.locator(".lead")).to_contain_text("You cancelled this order")
    expect(page.get_by_role("link", name="Cancel order")).to_have_count(0)
    order_url = page.url

    # Held, not yet given back: the compensation runs in a worker, after the cancel commits.
    assert stock_shown(page, base_url, "MUG-350-NVY") == "Sold out"
    assert "done" in run_pending_deliveries(app)
    assert stock_shown(page, base_url, "MUG-350-NVY") == "3 in stock"

    page.goto(order_url)
    expect(page.locator(".lead")).to_contain_text("its items are back on sale")
    page.screenshot(path=screenshot_dir / "customer_cancelled_order.png", full_page=True)
    assert refused == []
    assert on_hand("MUG-350-NVY", app) == 3


def test_an_operator_logs_in_and_reads_a_paid_orders_transitions(page, shop, sandbox, screenshot_dir):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    customer = Shopper(app, app.skus)
    placed = customer.place("SOCK-M", 1)
    sandbox.set_outcome(placed["payment"]["session_id"], "paid")
    # Paid through the registered webhook; the bound is generous for a loaded CI machine.
    wait_for_status(customer, placed["reference"], "Paid", timeout=20)
    reference = placed["reference"]

    page.goto(f"{base_url}/console/")
    expect(page).to_have_url(re.compile(r"/console/login"))
    page.get_by_label("Email").fill("ops@example.com")
    page.get_by_label("Password").fill("wrong password")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".flash.error, [role=alert]").first).to_contain_text("do not match")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()

    expect(page.get_by_role("heading", name="What needs attention")).to_be_visible()
    expect(page.locator(".tile", has_text="Stuck orders").locator(".big")).to_have_text("0")
    expect(page.get_by_role("button", name="Log out ops@example.com")).to_be_visible()

    page.get_by_role("navigation").get_by_role("link", name="Orders").click()
    page.get_by_label("only stuck").uncheck()
    page.get_by_role("button", name="Show").click()
    page.get_by_role("link", name=reference).click()

    expect(page).to_have_url(f"{base_url}/console/orders/{reference}")
    expect(page.locator("h1 .badge")).to_have_text("Paid")
    timeline = page.locator("table.timeline")
    transitions = timeline.locator("tr.kind-transition strong").all_inner_texts()
    # In the shop's words (shop/console/words.py); the JSON keeps the event names.
    assert transitions == ["Order placed", "Payment page opened", "Paid"]
    expect(timeline).to_contain_text("Payment page completed: applied")  # the webhook, by what it said
    page.screenshot(path=screenshot_dir / "operator_order_timeline.png", full_page=True)
