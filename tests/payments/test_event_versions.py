"""Events in every API version the shop can meet (docs/REFERENCE.md, Webhook): the provider keeps
an event in the version it was created with for 30 days, so after an upgrade the webhook's
retries and the sweep's event reads bring older shapes. Real database, Redis and sandbox."""

from __future__ import annotations

import copy

from payment_helpers import HTML, Shopper, order_id, post_webhook, sandbox_event
from shop.extensions import db
from shop.models import Order

SHIPPING = {"name": "Grace Hopper", "line1": "1 Navy Yard", "city": "Arlington", "postal_code": "22202",
            "state": "VA", "country": "US"}  # fmt: skip


def _in_2024_06_20_shape(event: dict) -> dict:
    """The event as an endpoint on 2024-06-20 received it: the collected shipping address at the
    session's top level (`shipping_details`), before `collected_information` existed."""
    old = copy.deepcopy(event)
    session = old["data"]["object"]
    session["shipping_details"] = (session.pop("collected_information", None) or {}).get("shipping_details")
    old["api_version"] = "2024-06-20"
    return old


def test_a_completed_session_event_in_an_older_api_versions_shape_pays_the_order_with_its_address(make_shop, sandbox):
    app = make_shop(sandbox=True)
    shopper = Shopper(app)
    order = shopper.place()
    sid = order["payment"]["session_id"]
    sandbox.set_outcome(sid, "paid", shipping_address=SHIPPING)
    event = sandbox_event(sandbox, "checkout.session.completed", sid)
    assert event["data"]["object"]["collected_information"]["shipping_details"]["name"] == "Grace Hopper"

    answer = post_webhook(app.test_client(), _in_2024_06_20_shape(event))

    assert answer.status_code == 200, answer.get_data(as_text=True)
    paid = shopper.order(order["reference"])
    assert paid["status"] == "Paid"
    assert paid["shipping"]["name"] == "Grace Hopper" and paid["shipping"]["address"]["line1"] == "1 Navy Yard"
    with app.app_context():
        row = db.session.get(Order, order_id(app, order["reference"]))
        assert (row.charged, row.tax) == (order["total"], 0)
        db.session.remove()
    page = shopper.client.get(f"/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
    assert "1 Navy Yard" in page
