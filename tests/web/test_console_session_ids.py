"""An operator's order page names the provider's session by its start only (shop/web/__init__.py,
`short_id`): the order's reference is what the page is about, and a whole session id opens the
customer's order on the payment return page. Links to the provider keep it whole in their
address, where the provider asks for its own login."""

from __future__ import annotations

import re

from factories import force_order, placed_order_in

SESSION = "cs_test_a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuV"


def test_the_console_order_page_shows_the_session_ids_start_not_the_whole(fresh_app, fresh_client, token):
    order_id, ref = placed_order_in(fresh_app)
    with fresh_app.app_context():
        force_order(order_id, payment_session_id=SESSION)
    page = fresh_client.get(f"/console/orders/{ref}").get_data(as_text=True)
    assert ref in page
    shown = re.sub(r'href="[^"]*"', "", page)
    assert SESSION not in shown
    assert SESSION[:14] + "\u2026" in shown
