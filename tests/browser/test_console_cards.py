"""The cards that check themselves and the evidence pages, in a real browser at 1280 and 390 px:
the dashboard's first line and a red card acknowledged through its form, the webhook list with
the noise's address, a receipt's body and its re-apply (a no-op for an applied event, and the
page says so), and an order whose payment did not start with the provider's words on its
timeline. Each page passes axe-core (serious and critical findings) and, on the phone, fits."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from payment_helpers import Shopper
from shop.extensions import db
from shop.models import WebhookReceipt
from shop.seed import upsert_operator
from support import wait_until

from .test_console_phone import OVERFLOW
from .test_storefront_pages import WIDTHS, axe_problems

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox


def _paid_order_with_its_webhook(app, sandbox) -> int:
    """A paid order whose completed event the sandbox delivered to the served shop: its receipt id."""
    shopper = Shopper(app, app.skus)
    order = shopper.place()
    sandbox.set_outcome(order["payment"]["session_id"], "paid")

    def accepted():
        with app.app_context():
            found = db.session.execute(
                select(WebhookReceipt.id).where(
                    WebhookReceipt.event_type == "checkout.session.completed", WebhookReceipt.outcome == "accepted"
                )
            ).scalar()
            db.session.remove()
        return found

    return wait_until(accepted, 10, "the sandbox's completed event to reach the shop")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_cards_and_the_evidence_pages_work_and_pass_axe(new_page, shop, sandbox, width, screenshot_dir):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    receipt_id = _paid_order_with_its_webhook(app, sandbox)
    sandbox.faults(api_unavailable=True)
    failed_ref = Shopper(app, app.skus).buy()  # the payment does not start: its try is on the timeline
    sandbox.faults(api_unavailable=False)
    with app.app_context():
        db.session.add_all(
            [
                WebhookReceipt(  # noise from a scanner
                    outcome="rejected",
                    reason="no Stripe-Signature header",
                    http_status=400,
                    signed=False,
                    source_address="198.51.100.23",
                    body='{"hello": "scanner"}',
                ),
                WebhookReceipt(  # the provider's own delivery, signed and unusable: red
                    outcome="rejected",
                    reason="unparseable body: not a Stripe event",
                    http_status=400,
                    signed=True,
                    source_address="203.0.113.10",
                    body=json.dumps([1, 2]),
                ),
            ]
        )
        db.session.commit()
        db.session.remove()

    page = new_page(viewport=WIDTHS[width], is_mobile=width == "phone")
    found: dict[str, list] = {}

    def check(name: str) -> None:
        page.wait_for_load_state()
        page.screenshot(path=str(screenshot_dir / f"cards-{width}-{name}.png"), full_page=True)
        found[name] = axe_problems(page)
        if width == "phone":
            fit = page.evaluate(OVERFLOW, WIDTHS[width]["width"])
            assert fit["doc"][0] <= fit["doc"][1] and not fit["out"], (name, fit)

    page.goto(f"{base_url}/console/login")
    page.get_by_label("Email").fill("ops@example.com")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/console/")

    summary = page.locator("#needs-human")
    assert "need" in summary.inner_text() and "Webhooks" in summary.inner_text()
    webhooks = page.locator("#card-rejected_webhooks")
    assert "needs a human" in webhooks.inner_text() and "198.51.100.23" in webhooks.inner_text()
    page.locator("#card-rejected_webhooks details.ack summary").click()
    check("dashboard-ack-form")
    webhooks.get_by_label("Why (the next operator reads this)").fill("known: a bad deploy, fixing")
    page.locator("#card-rejected_webhooks").get_by_role("button", name="Acknowledge").click()
    page.wait_for_url(f"{base_url}/console/")
    assert "acknowledged until" in page.locator("main").inner_text()
    acked = page.locator("#card-rejected_webhooks")
    assert "Acknowledged by ops@example.com" in acked.inner_text() and "known: a bad deploy" in acked.inner_text()
    assert "Webhooks" not in summary.inner_text().split("acknowledged:")[0]
    check("dashboard")

    page.goto(f"{base_url}/console/webhooks?outcome=rejected&signed=no")
    assert "198.51.100.23" in page.locator("main").inner_text()
    check("webhooks-noise")

    page.goto(f"{base_url}/console/webhooks/{receipt_id}")
    assert "checkout.session.completed" in page.locator("pre.webhook-body").inner_text()
    check("webhook-detail")
    page.get_by_label("apply this event again").check()
    page.get_by_role("button", name="Re-apply").click()
    page.wait_for_url(f"{base_url}/console/webhooks/{receipt_id}")
    assert "This event was already applied: nothing changed." in page.locator("main").inner_text()
    check("webhook-reapplied")

    page.goto(f"{base_url}/console/orders/{failed_ref}")
    assert "did not start: provider unavailable" in page.locator("main").inner_text()
    check("order-failed-start")
    assert found == {name: [] for name in found}, found
