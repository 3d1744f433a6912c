"""A customer's path through the storefront, over HTTP via the test client."""

from factories import on_hand
from payment_helpers import HTML, Shopper
from shop.extensions import db
from shop.models import Order, ScheduledCommand


def test_checkout_without_a_reachable_provider_leaves_a_payable_order_with_its_deadline(shop):
    app = shop
    customer = Shopper(shop)
    client = customer.client
    r = customer.checkout("MUG-350-NVY", 2)
    assert r.status_code == 303, r.get_data(as_text=True)
    order_url = r.headers["Location"]
    assert "/orders/BK-" in order_url
    page = client.get(order_url, headers={"Accept": "application/json"})
    data = page.get_json()
    assert data["status"] == "PendingPayment"
    assert data["total"] == 3600 and data["lines"][0]["quantity"] == 2
    with app.app_context():
        assert on_hand("MUG-350-NVY") == 1
        order = db.session.query(Order).one()
        deadline = db.session.query(ScheduledCommand).filter_by(kind="expire_unpaid_order").one()
        assert deadline.order_id == order.id
    html = client.get(order_url).get_data(as_text=True)
    assert "Pay now" in html


def test_another_browser_gets_404_for_an_order_it_did_not_place(shop):
    # The provider unreachable, as the test above: with the default STRIPE_API_BASE a sandbox
    # that happened to listen on 127.0.0.1:12111 started the payment, and the checkout went to
    # its hosted page instead of the order.
    customer = Shopper(shop)
    client = customer.client
    r = customer.checkout("NB-A5-DOT", 1)
    order_url = r.headers["Location"]
    stranger = Shopper(shop)
    assert stranger.client.get(order_url).status_code == 404
    ref = order_url.rsplit("/", 1)[-1]
    r = stranger.cancel(ref, 1, headers=HTML)
    assert r.status_code == 404
    assert client.get(order_url, headers={"Accept": "application/json"}).get_json()["status"] == "PendingPayment"
