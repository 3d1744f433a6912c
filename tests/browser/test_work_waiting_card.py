"""The "Work waiting" card red in a real browser at 1280 and 390 px (docs/REFERENCE.md, Console):
it names the waiting delivery and whose claim lapsed, passes axe-core and, on the phone, fits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from compensation_support import cancel_in
from factories import placed_order_in
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import OutboxDelivery, WorkStatus
from shop.seed import upsert_operator

from .test_console_phone import OVERFLOW
from .test_storefront_pages import WIDTHS, axe_problems

pytestmark = pytest.mark.shop(served=True)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_red_waiting_card_names_the_lapsed_claim_and_passes_axe(new_page, shop, width, screenshot_dir):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    order_id, _ = placed_order_in(app)
    delivery = cancel_in(app, order_id)
    with app.app_context():
        db.session.execute(
            update(OutboxDelivery)
            .where(OutboxDelivery.id == delivery)
            .values(
                status=WorkStatus.PROCESSING, claimed_by="node-x:4242:1", claimed_until=utcnow() - timedelta(hours=1)
            )
        )
        db.session.commit()
        db.session.remove()
    page = new_page(viewport=WIDTHS[width], is_mobile=width == "phone")
    page.goto(f"{base_url}/console/login")
    page.get_by_label("Email").fill("ops@example.com")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/console/")
    card = page.locator("#card-waiting")
    text = card.inner_text()
    assert "Work waiting" in text and "needs a human" in text, text
    assert "node-x:4242:1 (node node-x, pid 4242, no longer registered)" in text, text
    page.screenshot(path=str(screenshot_dir / f"waiting-{width}.png"), full_page=True)
    assert axe_problems(page) == []
    if width == "phone":
        fit = page.evaluate(OVERFLOW, WIDTHS[width]["width"])
        assert fit["doc"][0] <= fit["doc"][1] and not fit["out"], fit
