"""The console on a phone (390 px wide): no page is wider than the screen. A table may be wider,
but then it scrolls inside itself; nothing else pokes out or is cut off, and no word is broken
letter by letter."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from factories import force_order
from payment_helpers import Shopper
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order, OutboxDelivery, ReconciliationCycle, WebhookReceipt
from shop.seed import upsert_operator

pytestmark = pytest.mark.shop(served=True)  # over real HTTP, registered with the sandbox

WIDTH = 390
# Every element sticking out of the viewport that is not inside an element that scrolls sideways,
# and every text cell narrower than a short word (the sign of letter-by-letter wrapping).
OVERFLOW = """(width) => {
  const scrolls = (el) => {
    for (let p = el.parentElement; p; p = p.parentElement) {
      const s = getComputedStyle(p);
      // Only a box that scrolls lets the reader reach what sticks out; one that hides or clips
      // it has cut it off (a page with main { overflow-x: hidden } must not pass).
      if (s.overflowX === 'auto' || s.overflowX === 'scroll') return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if ((r.right > width + 1 || r.left < -1) && !scrolls(el))
      out.push(el.tagName + '.' + el.className + ': ' + Math.round(r.left) + '..' + Math.round(r.right));
  }
  const narrow = [];
  for (const td of document.querySelectorAll('main td, main th')) {
    const r = td.getBoundingClientRect();
    if (td.textContent.trim().length > 3 && r.width > 0 && r.width < 40)
      narrow.push(td.textContent.trim().slice(0, 30));
  }
  return {doc: [document.documentElement.scrollWidth, document.documentElement.clientWidth], out, narrow};
}"""


def test_the_dashboard_an_order_and_the_outbox_fit_a_390px_phone(new_page, shop, sandbox, screenshot_dir):
    app, base_url = shop, shop.config["PUBLIC_BASE_URL"]
    with app.app_context():
        upsert_operator("ops@example.com", "correct horse battery")
        db.session.remove()
    sandbox.faults(api_unavailable=True)
    Shopper(app, app.skus).checkout("SOCK-M", 1)  # stays PendingPayment: stuck once it is old
    sandbox.faults(api_unavailable=False)
    long_error = (
        "ProviderRefused: the payment provider answered 402 card_declined for "
        "cs_test_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0u1V2w3X4y5Z6 after 5 attempts, see logs"
    )
    with app.app_context():
        order = db.session.execute(select(Order)).scalars().first()
        force_order(None, updated_at=utcnow() - timedelta(hours=2))
        db.session.execute(
            update(OutboxDelivery).values(
                status="dead", last_error=long_error, last_traceback="Traceback ...\n" + long_error
            )
        )
        db.session.add(
            WebhookReceipt(outcome="rejected", reason="signature does not match: " + "x" * 80, http_status=400)
        )
        now = utcnow()
        db.session.add(
            ReconciliationCycle(
                started_at=now,
                finished_at=now,
                cutoff=now,
                status="ok",
                expiry_counts={},
                provider_counts={},
                errors=[{"pass": "provider", "order_id": order.id, "error": long_error}],
            )
        )
        reference = order.reference
        db.session.commit()
        db.session.remove()

    page = new_page(viewport={"width": WIDTH, "height": 844}, is_mobile=True, device_scale_factor=1)
    errors = []  # anything the browser logs as an error (a refused policy, a missing file)
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"{base_url}/console/login")
    page.get_by_label("Email").fill("ops@example.com")
    page.get_by_label("Password").fill("correct horse battery")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/console/")
    for name, path in (
        ("dashboard", "/console/"),
        ("order", f"/console/orders/{reference}"),
        ("outbox", "/console/outbox"),
        ("dead", "/console/outbox?status=dead"),
        ("orders", "/console/orders"),
        ("orders searched", "/console/orders?q=example&from=2026-01-01&amount_min=1&amount_max=500"),
        ("refunds", "/console/refunds"),
        ("restore warnings", "/console/restore-warnings"),
        ("sweeps", "/console/sweeps"),
        ("webhooks", "/console/webhooks"),
        ("audit", "/console/audit"),
    ):
        page.goto(base_url + path)
        page.screenshot(path=str(screenshot_dir / f"phone-{name}.png"), full_page=True)
        found = page.evaluate(OVERFLOW, WIDTH)
        scroll_width, client_width = found["doc"]
        assert scroll_width <= client_width, (path, found)
        assert not found["out"], (path, found["out"][:10])
        assert not found["narrow"], (path, found["narrow"][:10])
    page.goto(base_url + "/console/")
    assert page.locator("#chart-placed svg").count() == 1
    assert errors == []
