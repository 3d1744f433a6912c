"""The refunds, webhooks and restore-warning lists and the dashboard in a real browser at 1280 and
390 px: each says in words what it used to show as a code (a provider's decline, an event type, a
state, a stuck order's state, a process's state), keeps the code behind a closed "Technical
detail" an operator can open, shows UTC with the browser's local time beside it, and passes axe
with nothing serious, fitting the phone. A Technical detail opened on a page that refreshes itself
stays open across the refresh."""

from __future__ import annotations

from datetime import timedelta

import pytest

from browser.layout import OPERATOR, log_in_operator, page_problems
from browser.test_storefront_pages import WIDTHS
from factories import force_order, placed_order_in
from shop.domain.deadlines import utcnow
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import Order, RestoreWarning, UnknownPaymentStatus, WarningState, WebhookReceipt
from shop.models.payments import Refund, UnknownPayment
from shop.seed import upsert_operator
from support import leave_heartbeats

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed").expect

# Each page: what it must say in words, and a code it must keep folded (shown only once opened).
PAGES = {
    "refunds": (
        "/console/refunds",
        "the card it would go back to has expired or was cancelled",
        "expired_or_canceled_card",
    ),
    "webhooks": ("/console/webhooks", "Payment page completed", "checkout.session.completed"),
    "restore-warnings": ("/console/restore-warnings", "same as another warning", "duplicate"),
    "dashboard": ("/console/", "At the payment page", "rq-scheduler"),
}


def _rows_to_read(app) -> None:
    """A failed refund, money for an unknown order, a webhook, an open and a folded restore
    warning, a stuck order at the payment page, and a worker's and a scheduler's heartbeats."""
    order_id, _ = placed_order_in(app)
    stuck_id, _ = placed_order_in(app)
    leave_heartbeats(app)
    with app.app_context():
        force_order(stuck_id, status=OrderStatus.PAYMENT_INITIATED, updated_at=utcnow() - timedelta(days=1))
        order = db.session.get(Order, order_id)
        assert order is not None
        db.session.add_all(
            [
                Refund(
                    order_id=order_id,
                    session_id="cs_browser_words",
                    amount=order.total,
                    currency=order.currency,
                    reason="late money",
                    status="failed",
                    failure_reason="expired_or_canceled_card",
                    failed_at=utcnow(),
                ),
                UnknownPayment(
                    session_id="cs_browser_unknown",
                    reference="BK-ELSEWHERE",
                    amount=1800,
                    currency="usd",
                    status=UnknownPaymentStatus.NOT_OURS,
                    found_via="sweep: unknown money",
                    detail="no shop mark",
                ),
                WebhookReceipt(
                    event_id="evt_browser_words",
                    event_type="checkout.session.completed",
                    outcome="accepted",
                    reason="",
                    http_status=200,
                    order_id=order_id,
                ),
                RestoreWarning(order_id=order_id, variant_id=7, quantity=1, reason="no inventory row"),
                RestoreWarning(
                    order_id=order_id,
                    variant_id=7,
                    quantity=1,
                    reason="no inventory row",
                    state=WarningState.DUPLICATE,
                    resolution="same problem as warning 1",
                    resolved_at=utcnow(),
                ),
            ]
        )
        db.session.commit()
        db.session.remove()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_lists_and_dashboard_say_words_fold_their_codes_show_local_time_and_pass_axe(new_page, shop, width):
    pytest.importorskip("axe_playwright_python", reason="the axe-playwright-python package is not installed")
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator(*OPERATOR)
        db.session.remove()
    _rows_to_read(app)
    viewport = WIDTHS[width]
    page = new_page(viewport=viewport, is_mobile=width == "phone", device_scale_factor=1)
    log_in_operator(page, base_url)
    found: dict[str, list[str]] = {}
    for name, (path, words, code) in PAGES.items():
        page.goto(f"{base_url}{path}")
        main = page.locator("main")
        expect(main).to_contain_text(words)
        shown = main.inner_text()  # a closed <details> is not rendered, so not read
        problems = [f"shows the code {code!r} unfolded"] if code in shown else []
        folded = main.locator("details.code-detail").filter(has_text=code).first
        assert folded.get_attribute("open") is None
        folded.locator("summary").click()
        expect(folded.locator("code", has_text=code).first).to_be_visible()
        stamp = main.locator("time[data-beside]").first
        expect(stamp).to_contain_text("here)")  # the script put the local time beside the UTC text
        assert "UTC (" in stamp.inner_text(), stamp.inner_text()
        found[name] = problems + page_problems(page, viewport["width"] if width == "phone" else None)
    assert found == {name: [] for name in PAGES}, found


def test_a_technical_detail_opened_stays_open_when_the_page_refreshes_itself(page, shop):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator(*OPERATOR)
        db.session.remove()
    _rows_to_read(app)
    log_in_operator(page, base_url)
    page.goto(f"{base_url}/console/webhooks")  # refreshes itself every 5 s (data-refresh)
    folded = page.locator("details.code-detail").first
    folded.locator("summary").click()
    expect(folded.locator("code").first).to_be_visible()
    page.evaluate("document.querySelector('main h1').dataset.before = 'swap'")
    expect(page.locator("main h1[data-before]")).to_have_count(0, timeout=20_000)  # <main> was swapped
    expect(page.locator("details.code-detail").first).to_have_attribute("open", "")
    expect(page.locator("details.code-detail").first.locator("code").first).to_be_visible()
