"""Orders paid with a held card payment (CAPTURE_MODE=dispatch, the shop of the fixture
`dispatch_shop` in tests/payments/conftest.py), for the tests of holds: one order whose payment
the sandbox holds, applied by the signed webhook, and its PaymentIntent."""

from __future__ import annotations

from payment_helpers import Shopper, post_webhook, sandbox_event
from shop.extensions import db
from shop.provider import gateway


def held_order(app, sandbox) -> tuple[Shopper, dict, str]:
    """One order of a SOCK-M, its card payment held at the sandbox and the webhook applied (the
    order Authorized): (the shopper, the order's JSON, its session's id)."""
    shopper = Shopper(app, app.skus)
    placed = shopper.place("SOCK-M", 1)
    sid = placed["payment"]["session_id"]
    assert sandbox.set_outcome(sid, "paid")["payment_status"] == "unpaid"  # held: as Stripe reports it
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", sid))
    assert r.get_json()["outcome"] == "authorized", r.get_json()
    return shopper, shopper.order(placed["reference"]), sid


def payment_intent_of(app, session_id: str) -> str:
    """The PaymentIntent the provider made for a session."""
    with app.app_context():
        intent = gateway.retrieve_session(session_id).payment_intent
        db.session.remove()
    assert intent, f"session {session_id} has no PaymentIntent"
    return intent
