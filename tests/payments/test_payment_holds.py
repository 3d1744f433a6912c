"""The gateway's calls for a payment held for a later capture, against the bundled sandbox: the
views say a payment is held (and until when), a capture takes it once whatever the retries, a void
releases it, and a capture of a voided or lapsed hold is the provider's refusal with its code."""

from __future__ import annotations

from datetime import timedelta

import pytest
import stripe

from shop.domain.deadlines import utcnow
from shop.provider import gateway

WEEK = timedelta(days=7)


def held_session(sandbox, amount: int = 2500, **capture) -> tuple[str, str]:
    """A session paid by card under manual capture (per method unless `capture` says otherwise):
    (session id, PaymentIntent id)."""
    sdk = stripe.StripeClient("sk_test_sandbox", base_addresses={"api": sandbox.base_url}, max_network_retries=0)
    session = sdk.v1.checkout.sessions.create(
        params={
            "mode": "payment",
            "success_url": "http://shop.test/ok",
            "metadata": {"order_id": "41"},
            "line_items": [
                {
                    "price_data": {"currency": "usd", "unit_amount": amount, "product_data": {"name": "Mug"}},
                    "quantity": 1,
                }
            ],
            **(capture or {"payment_method_options": {"card": {"capture_method": "manual"}}}),
        }
    )
    return session.id, sandbox.set_outcome(session.id, "paid")["payment_intent"]


def test_a_held_payment_reads_as_held_with_its_capture_deadline(fresh_paying_app, sandbox):
    session_id, intent = held_session(sandbox)
    with fresh_paying_app.app_context():
        session = gateway.retrieve_session(session_id)
        payment = gateway.retrieve_payment(intent)
    assert session.payment_status == gateway.SessionPaymentStatus.UNPAID
    assert session.hold.capture_method == gateway.CaptureMethod.MANUAL
    assert session.hold.amount_capturable == 2500
    assert session.hold.capture_before is not None
    assert abs(session.hold.capture_before - (utcnow() + WEEK)) < timedelta(minutes=1)
    assert payment.held and payment.status == gateway.PaymentIntentStatus.REQUIRES_CAPTURE
    assert (payment.order_id, payment.amount, payment.amount_received) == (41, 2500, 0)
    assert payment.hold == session.hold


def test_a_payment_captured_at_once_reads_as_not_held(fresh_paying_app, sandbox):
    session_id, intent = held_session(sandbox, payment_intent_data={"capture_method": "automatic"})
    with fresh_paying_app.app_context():
        session = gateway.retrieve_session(session_id)
        payment = gateway.retrieve_payment(intent)
    assert session.payment_status == gateway.SessionPaymentStatus.PAID
    assert (session.hold.capture_method, session.hold.amount_capturable) == (gateway.CaptureMethod.AUTOMATIC, 0)
    assert not payment.held and payment.amount_received == 2500


def test_a_retried_capture_with_its_key_captures_once_and_another_key_is_refused(fresh_paying_app, sandbox):
    _, intent = held_session(sandbox)
    with fresh_paying_app.app_context():
        first = gateway.capture_payment(intent, None, "backstop-capture-order-41")
        again = gateway.capture_payment(intent, None, "backstop-capture-order-41")
        with pytest.raises(gateway.ProviderRefused) as refused:
            gateway.capture_payment(intent, None, "backstop-capture-order-41-other")
    assert first == again
    assert (first.status, first.amount_received, first.hold.amount_capturable) == ("succeeded", 2500, 0)
    assert len(sandbox.events("charge.captured")) == 1
    assert refused.value.code == "payment_intent_unexpected_state"
    assert "status of succeeded" in str(refused.value)


def test_a_partial_capture_takes_only_the_amount_asked(fresh_paying_app, sandbox):
    _, intent = held_session(sandbox)
    with fresh_paying_app.app_context():
        captured = gateway.capture_payment(intent, 1800, "backstop-capture-order-41")
        with pytest.raises(gateway.ProviderRefused) as too_much:
            gateway.capture_payment(held_session(sandbox)[1], 2600, "backstop-capture-order-42")
    assert (captured.status, captured.amount_received) == ("succeeded", 1800)
    assert too_much.value.code == "amount_too_large"


def test_a_void_releases_the_hold_and_a_later_capture_is_refused(fresh_paying_app, sandbox):
    _, intent = held_session(sandbox)
    with fresh_paying_app.app_context():
        voided = gateway.void_payment(intent, "backstop-void-order-41", reason="requested_by_customer")
        assert gateway.void_payment(intent, "backstop-void-order-41", reason="requested_by_customer") == voided
        with pytest.raises(gateway.ProviderRefused) as refused:
            gateway.capture_payment(intent, None, "backstop-capture-order-41")
    assert (voided.status, voided.cancellation_reason, voided.amount_received) == (
        "canceled",
        "requested_by_customer",
        0,
    )
    assert voided.hold.amount_capturable == 0 and not voided.held
    assert refused.value.code == "payment_intent_unexpected_state"
    assert [e["type"] for e in sandbox.events() if e["type"].startswith("refund.")] == []


def test_a_capture_after_the_hold_lapsed_is_refused_as_the_provider_refuses_it(fresh_paying_app, sandbox):
    sandbox.account(authorization_validity_seconds=3600)
    _, intent = held_session(sandbox)
    sandbox.advance_clock(3600)
    with fresh_paying_app.app_context():
        payment = gateway.retrieve_payment(intent)
        with pytest.raises(gateway.ProviderRefused) as refused:
            gateway.capture_payment(intent, None, "backstop-capture-order-41")
    assert (payment.status, payment.cancellation_reason) == ("canceled", "automatic")
    assert refused.value.code == "payment_intent_unexpected_state"


def test_a_capture_during_an_outage_is_unavailable_and_the_hold_stays(fresh_paying_app, sandbox):
    _, intent = held_session(sandbox)
    sandbox.faults(api_unavailable=True)
    with fresh_paying_app.app_context():
        with pytest.raises(gateway.ProviderUnavailable):
            gateway.capture_payment(intent, None, "backstop-capture-order-41")
        sandbox.faults(api_unavailable=False)
        assert gateway.retrieve_payment(intent).held
