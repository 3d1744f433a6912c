"""Stripe's Checkout Session `url` is nullable. The shop redirects a customer to it after checkout
and after "Pay now": a session that comes back without one must be a payment that could not be
started, in words, never a redirect to "None"."""

from __future__ import annotations

from sqlalchemy import select

from factories import seed_catalog_rows
from payment_helpers import Shopper, order_id
from shop.extensions import db
from shop.models import ProviderRefusal
from support import csrf_token


def test_a_session_without_a_url_is_a_payment_not_started_never_a_redirect_to_none(fresh_paying_app, sandbox):
    """A Checkout Session's `url` is nullable: checkout and "Pay now" send the customer to the order
    page with words instead of to "None", the session is expired so it can take no money, and the
    operator sees why."""
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    sandbox.faults(checkout_url_null=True)

    placed = shopper.checkout()
    assert placed.status_code == 303
    location = placed.headers["Location"]
    assert "None" not in location and location.startswith("/orders/BK-"), location
    ref = location.rsplit("/", 1)[-1]
    order = shopper.order(ref)
    assert order["status"] == "PendingPayment" and order["payment"] is None
    page = shopper.client.get(location).get_data(as_text=True)
    assert "could not open the payment page" in page and "Pay now" in page

    paying = shopper.pay(ref)
    assert paying.status_code == 503 and "None" not in (paying.headers.get("Location") or "")
    assert "could not open the payment page" in paying.get_json()["error"]
    html = shopper.client.post(f"/orders/{ref}/pay", data={"csrf_token": csrf_token(shopper.client, location)})
    assert html.status_code == 503 and "Location" not in html.headers
    assert shopper.order(ref)["status"] == "PendingPayment"

    with sandbox.sandbox.lock:
        sessions = [s for s in sandbox.sandbox.sessions.values() if s.client_reference_id == ref]
        assert sessions and all(s.status == "expired" for s in sessions)
    with fresh_paying_app.app_context():
        refusals = (
            db.session.execute(
                select(ProviderRefusal).where(ProviderRefusal.order_id == order_id(fresh_paying_app, ref))
            )
            .scalars()
            .all()
        )
        assert refusals and all(r.code == "session_without_url" for r in refusals)
        db.session.remove()
