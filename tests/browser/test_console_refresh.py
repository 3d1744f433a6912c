"""The console keeps itself current: the dashboard shows a new stuck order by itself, with no
reload (the page's own script fetches it and swaps it in), and says how fresh it is."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from playwright.sync_api import expect

from factories import force_order
from payment_helpers import Shopper
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.seed import upsert_operator

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox


def test_the_dashboard_shows_a_newly_stuck_order_without_a_reload(page, shop, sandbox):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    page.goto(f"{base_url}/console/")
    page.get_by_label("Email").fill("ops@example.com")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()
    stuck = page.locator(".tile", has_text="Stuck orders").locator(".big")
    expect(stuck).to_have_text("0")
    page.evaluate("window.__same_page = true")  # gone if the browser loaded the page again

    sandbox.faults(api_unavailable=True)
    Shopper(app, app.skus).checkout("SOCK-M", 1)  # PendingPayment...
    sandbox.faults(api_unavailable=False)
    with app.app_context():  # ...and unchanged for longer than the stuck age
        force_order(None, updated_at=utcnow() - timedelta(hours=2))
        db.session.remove()

    expect(stuck).to_have_text("1", timeout=20_000)
    assert page.evaluate("window.__same_page") is True
    expect(page.locator("[data-updated]")).to_have_text(re.compile(r"Updated (just now|\d+ s ago)"))
