"""Starting the payment of a just-placed order without reading it back: the checkout hands
start_payment what place_order committed, the provider call runs outside any transaction, and
the PaymentInitiated transition is one UPDATE guarded by the version and the allowed states,
committed with its outbox event. Real database, Redis and sandbox."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from factories import force_order, place_order_for, seed_catalog_rows
from payment_helpers import JSON, Shopper
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import Order, OutboxEvent, Variant
from shop.orders.cancel import cancel_order
from shop.payments.start import start_payment
from shop.provider import gateway

SKU = "MUG-350-SND"


def _place(quantity: int = 1):
    """place_order on a fresh cart; returns its Placed result."""
    seed_catalog_rows()
    return place_order_for({SKU: quantity})


def _row(order_id: int) -> Order:
    db.session.expire_all()
    return db.session.get(Order, order_id)


def _event_names(order_id: int) -> list[str]:
    names = list(
        db.session.execute(
            select(OutboxEvent.name).where(OutboxEvent.order_id == order_id).order_by(OutboxEvent.id)
        ).scalars()
    )
    db.session.rollback()
    return names


def _sessions_for(sandbox, reference: str) -> list[str]:
    with sandbox.sandbox.lock:
        return [s.id for s in sandbox.sandbox.sessions.values() if s.client_reference_id == reference]


def test_a_checkout_commits_payment_initiated_with_its_event_from_what_it_placed(fresh_paying_app, sandbox):
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    r = shopper.checkout(SKU, 2)
    assert r.status_code == 303
    order = shopper.latest()
    assert r.headers["Location"] == order["payment"]["url"]

    with fresh_paying_app.app_context():
        row = db.session.execute(select(Order).where(Order.reference == order["reference"])).scalar_one()
        assert (row.status, row.version, row.payment_attempts) == ("PaymentInitiated", 2, 1)
        assert as_utc(row.updated_at) > as_utc(row.created_at)  # the transition is a state change
        assert _event_names(row.id) == ["OrderPlaced", "PaymentInitiated"]
        payload = db.session.execute(
            select(OutboxEvent.payload).where(OutboxEvent.order_id == row.id, OutboxEvent.name == "PaymentInitiated")
        ).scalar_one()
        assert payload["session_id"] == row.payment_session_id
        # The session at the provider was made from the lines and total place_order committed.
        view = gateway.retrieve_session(row.payment_session_id)
        assert (view.client_reference_id, view.order_id, view.amount_total, view.status) == (
            row.reference,
            row.id,
            row.total,
            "open",
        )
        assert row.total == 2 * db.session.execute(select(Variant.price).where(Variant.sku == SKU)).scalar_one()
        assert as_utc(row.payment_session_expires_at) == view.expires_at
        db.session.remove()


def test_a_payment_start_that_loses_to_a_cancel_changes_nothing_and_expires_its_session(fresh_paying_app, sandbox):
    with fresh_paying_app.app_context():
        placed = _place()
        assert cancel_order(placed.order_id, 1).status == "cancelled"  # version 1 -> 2, meanwhile

        outcome = start_payment(placed.order_id, placed=placed)  # still believes version 1

        assert outcome.status == "refused" and outcome.order_status == "Cancelled"
        row = _row(placed.order_id)
        assert (row.status, row.version, row.payment_session_id, row.payment_attempts) == ("Cancelled", 2, None, 0)
        assert "PaymentInitiated" not in _event_names(placed.order_id)
        [sid] = _sessions_for(sandbox, placed.reference)  # the provider was asked, then told to forget it
        assert gateway.retrieve_session(sid).status == "expired"
        db.session.remove()


def test_a_payment_start_refuses_a_state_the_transition_forbids_even_at_the_version_it_saw(fresh_paying_app, sandbox):
    with fresh_paying_app.app_context():
        placed = _place()
        # A row at version 1 that is no longer payable (only a writer that skipped the version
        # could leave this; the status condition refuses it all the same).
        force_order(placed.order_id, status="Paid")

        assert start_payment(placed.order_id, placed=placed).status == "refused"

        row = _row(placed.order_id)
        assert (row.status, row.version, row.payment_session_id) == ("Paid", 1, None)
        assert "PaymentInitiated" not in _event_names(placed.order_id)
        db.session.remove()


def test_paying_a_stored_order_again_reads_it_and_applies_the_same_guarded_transition(fresh_paying_app, sandbox):
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    sandbox.faults(api_unavailable=True)
    ref = shopper.buy(SKU, 1)
    sandbox.faults(api_unavailable=False)
    assert shopper.order(ref)["status"] == "PendingPayment"

    r = shopper.pay(ref)

    assert r.status_code == 200
    order = shopper.order(ref)
    assert (order["status"], order["version"]) == ("PaymentInitiated", 2)
    assert r.get_json()["payment_url"] == order["payment"]["url"]
    with fresh_paying_app.app_context():
        row = db.session.execute(select(Order).where(Order.reference == ref)).scalar_one()
        assert row.payment_attempts == 1 and _event_names(row.id) == ["OrderPlaced", "PaymentInitiated"]
        db.session.remove()


@pytest.mark.parametrize("provider_up", [True, False])
def test_a_json_client_checking_out_gets_the_contracts_303_and_the_same_facts_in_the_body(
    fresh_paying_app, sandbox, provider_up
):
    """docs/REFERENCE.md, Storefront, names a 303 for a placed order, to the hosted page or, with the
    provider down, to the order page: the status does not depend on what the client accepts."""
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    sandbox.faults(api_unavailable=not provider_up)
    shopper.add(SKU)
    r = shopper.checkout_cart(headers=JSON)
    assert r.status_code == 303 and r.is_json
    body = r.get_json()
    assert r.headers["Location"] == (body["payment_url"] if provider_up else body["order_url"])
    assert body["order_url"].endswith(f"/orders/{body['reference']}")
    assert (body["payment_url"] is None) is (not provider_up)
    assert shopper.order(body["reference"])["status"] == ("PaymentInitiated" if provider_up else "PendingPayment")


def test_a_payment_start_that_loses_to_the_same_attempt_keeps_the_session_both_were_given(fresh_paying_app, sandbox):
    """A double click on "Pay now": both requests read the order at the same version and ask for
    the same attempt, so the provider (same Idempotency-Key) hands both the same session. The
    loser of the write must not expire it: it is the payment page the winner just committed."""
    with fresh_paying_app.app_context():
        placed = _place()
        now = utcnow()
        first = start_payment(placed.order_id, now=now, placed=placed)
        second = start_payment(placed.order_id, now=now, placed=placed)  # read version 1 too

        assert first.status == "started" and second.status == "started"
        assert second.url == first.url
        row = _row(placed.order_id)
        assert (row.status, row.version, row.payment_attempts) == ("PaymentInitiated", 2, 1)
        assert _sessions_for(sandbox, placed.reference) == [row.payment_session_id]
        assert gateway.retrieve_session(row.payment_session_id).status == "open"
        db.session.remove()
