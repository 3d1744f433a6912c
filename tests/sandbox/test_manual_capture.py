"""Manual capture as Stripe does it: a held card payment, its capture, its cancel (the void), and
the hold lapsing on the sandbox's clock; with the faults and the state file."""

import json
from urllib.parse import urlsplit

import pytest
import stripe

from shop.stripe_sandbox.persist import StateFile, snapshot
from shop.stripe_sandbox.state import Sandbox

from .test_hosted_page_and_shapes import browser
from .test_idempotency_and_refunds import session_params

WEEK = 7 * 24 * 3600
MANUAL = {"payment_intent_data": {"capture_method": "manual"}}
CARD_MANUAL = {"payment_method_options": {"card": {"capture_method": "manual"}}}


def held(client, sandbox, amount=2500, **extra):
    """A session paid by card under manual capture: (session as rendered, PaymentIntent id)."""
    session = client.v1.checkout.sessions.create(params={**session_params(amount), **(extra or MANUAL)})
    completed = sandbox.set_outcome(session.id, "paid")
    return completed, completed["payment_intent"]


def charge_of(client, pi_id):
    pi = client.v1.payment_intents.retrieve(pi_id)
    session = client.v1.checkout.sessions.list(
        params={"payment_intent": pi_id, "expand": ["data.payment_intent.latest_charge"]}
    ).data[0]
    return pi, session.payment_intent.latest_charge


def event_types(sandbox):
    return [e["type"] for e in sandbox.events()]


def stripe_error(call):
    with pytest.raises(stripe.InvalidRequestError) as caught:
        call()
    return caught.value


def test_a_held_payment_requires_capture_its_session_is_complete_and_unpaid_and_the_charge_says_until_when(
    client, sandbox
):
    started = sandbox.sandbox.now()
    completed, pi_id = held(client, sandbox)
    assert (completed["status"], completed["payment_status"]) == ("complete", "unpaid")

    pi, charge = charge_of(client, pi_id)
    assert (pi.status, pi.capture_method, pi.amount_capturable, pi.amount_received) == (
        "requires_capture",
        "manual",
        2500,
        0,
    )
    assert (charge.status, charge.captured, charge.amount_captured, charge.paid) == ("succeeded", False, 0, True)
    capture_before = charge.payment_method_details.card.capture_before
    assert started + WEEK <= capture_before <= sandbox.sandbox.now() + WEEK
    assert event_types(sandbox) == ["payment_intent.amount_capturable_updated", "checkout.session.completed"]
    [updated] = sandbox.events("payment_intent.amount_capturable_updated")
    assert updated["event"]["data"]["object"]["amount_capturable"] == 2500


def test_the_card_option_holds_a_card_payment_and_the_intent_keeps_capture_method_automatic(client, sandbox):
    completed, pi_id = held(client, sandbox, **CARD_MANUAL)
    pi = client.v1.payment_intents.retrieve(pi_id)
    assert (pi.status, pi.capture_method) == ("requires_capture", "automatic")
    assert pi.payment_method_options.card.capture_method == "manual"
    assert completed["payment_method_options"]["card"] == {"capture_method": "manual"}


def test_a_method_without_manual_capture_is_captured_at_once_under_the_card_option(client, sandbox):
    sandbox.account(payment_methods=["card", "oxxo"])
    session = client.v1.checkout.sessions.create(params={**session_params(), **CARD_MANUAL})
    sandbox.set_outcome(session.id, "async_pending")
    sandbox.async_result(session.id, "succeeded")
    pi = client.v1.payment_intents.retrieve(client.v1.checkout.sessions.retrieve(session.id).payment_intent)
    assert (pi.status, pi.amount_received, pi.amount_capturable) == ("succeeded", 2500, 0)


def test_the_validity_of_a_hold_is_the_accounts_setting(client, sandbox):
    sandbox.account(authorization_validity_seconds=3600)
    frozen = sandbox.sandbox.freeze_clock()  # only advances move the sandbox's clock now
    _, pi_id = held(client, sandbox)
    _, charge = charge_of(client, pi_id)
    assert charge.payment_method_details.card.capture_before == frozen + 3600


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"payment_intent_data": {"capture_method": "later"}}, "payment_intent_data[capture_method]"),
        (
            {"payment_method_options": {"card": {"capture_method": "automatic"}}},
            "payment_method_options[card][capture_method]",
        ),
        ({"payment_method_options": {"card": {"setup": "x"}}}, "payment_method_options[card][setup]"),
    ],
)  # fmt: skip
def test_a_bad_capture_method_is_refused_naming_its_param(client, extra, param):
    error = stripe_error(lambda: client.v1.checkout.sessions.create(params={**session_params(), **extra}))
    assert error.http_status == 400 and error.param == param


def test_capture_takes_the_hold_and_sends_charge_captured_then_payment_intent_succeeded(client, sandbox):
    completed, pi_id = held(client, sandbox)
    captured = client.v1.payment_intents.capture(pi_id)
    assert (captured.status, captured.amount_received, captured.amount_capturable) == ("succeeded", 2500, 0)
    _, charge = charge_of(client, pi_id)
    assert (charge.captured, charge.amount_captured, charge.amount_refunded) == (True, 2500, 0)
    assert client.v1.checkout.sessions.retrieve(completed["id"]).payment_status == "paid"
    assert event_types(sandbox)[-2:] == ["charge.captured", "payment_intent.succeeded"]
    # Captured money is refundable as any payment.
    assert client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 500}).status == "succeeded"


def test_a_partial_capture_releases_the_rest_and_only_the_captured_amount_can_be_refunded(client, sandbox):
    _, pi_id = held(client, sandbox)
    captured = client.v1.payment_intents.capture(pi_id, params={"amount_to_capture": 1500})
    assert (captured.amount_received, captured.amount_capturable) == (1500, 0)
    _, charge = charge_of(client, pi_id)
    assert (charge.amount_captured, charge.amount_refunded, charge.refunded) == (1500, 1000, False)
    error = stripe_error(lambda: client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 1501}))
    assert error.code == "amount_too_large"


def test_capturing_more_than_is_held_is_refused_and_the_hold_stays(client, sandbox):
    _, pi_id = held(client, sandbox)
    error = stripe_error(lambda: client.v1.payment_intents.capture(pi_id, params={"amount_to_capture": 2501}))
    assert (error.http_status, error.code, error.param) == (400, "amount_too_large", "amount_to_capture")
    assert client.v1.payment_intents.retrieve(pi_id).status == "requires_capture"


def test_capturing_twice_is_stripes_unexpected_state_error_and_a_replayed_key_captures_once(client, sandbox):
    _, pi_id = held(client, sandbox)
    first = client.v1.payment_intents.capture(pi_id, options={"idempotency_key": "ship-1"})
    again = client.v1.payment_intents.capture(pi_id, options={"idempotency_key": "ship-1"})
    assert first.id == again.id and again.last_response.headers["Idempotent-Replayed"] == "true"
    assert event_types(sandbox).count("charge.captured") == 1

    error = stripe_error(lambda: client.v1.payment_intents.capture(pi_id))
    assert (error.http_status, error.code) == (400, "payment_intent_unexpected_state")
    assert "status of succeeded" in error.user_message
    assert error.json_body["error"]["payment_intent"]["status"] == "succeeded"


def test_an_uncaptured_payment_cannot_be_refunded_only_captured_or_canceled(client, sandbox):
    _, pi_id = held(client, sandbox)
    error = stripe_error(lambda: client.v1.refunds.create(params={"payment_intent": pi_id}))
    assert error.http_status == 400 and "uncaptured authorization" in error.user_message


def test_cancel_voids_the_hold_releasing_the_money_and_sends_payment_intent_canceled(client, sandbox):
    completed, pi_id = held(client, sandbox)
    canceled = client.v1.payment_intents.cancel(pi_id, params={"cancellation_reason": "requested_by_customer"})
    assert (canceled.status, canceled.cancellation_reason, canceled.amount_capturable) == (
        "canceled",
        "requested_by_customer",
        0,
    )
    assert canceled.canceled_at is not None and canceled.amount_received == 0
    _, charge = charge_of(client, pi_id)
    assert (charge.captured, charge.amount_refunded, charge.refunded) == (False, 2500, True)
    assert client.v1.checkout.sessions.retrieve(completed["id"]).payment_status == "unpaid"
    assert event_types(sandbox)[-1] == "payment_intent.canceled"

    error = stripe_error(lambda: client.v1.payment_intents.capture(pi_id))
    assert (error.code, "status of canceled" in error.user_message) == ("payment_intent_unexpected_state", True)


def test_a_captured_payment_cannot_be_canceled(client, sandbox):
    _, pi_id = held(client, sandbox)
    client.v1.payment_intents.capture(pi_id)
    error = stripe_error(lambda: client.v1.payment_intents.cancel(pi_id))
    assert (error.http_status, error.code) == (400, "payment_intent_unexpected_state")
    assert "status of succeeded" in error.user_message


def test_the_intent_of_an_open_session_is_not_canceled_but_its_session_expired(client, sandbox):
    session = client.v1.checkout.sessions.create(params={**session_params(), **MANUAL})
    sandbox.set_outcome(session.id, "declined")
    pi_id = client.v1.checkout.sessions.retrieve(session.id).payment_intent
    error = stripe_error(lambda: client.v1.payment_intents.cancel(pi_id))
    assert error.code == "payment_intent_unexpected_state" and "Expire the Checkout Session" in error.user_message
    assert client.v1.payment_intents.retrieve(pi_id).status == "requires_payment_method"


def test_a_bad_cancellation_reason_is_refused(client, sandbox):
    _, pi_id = held(client, sandbox)
    error = stripe_error(lambda: client.v1.payment_intents.cancel(pi_id, params={"cancellation_reason": "shipped"}))
    assert (error.http_status, error.param) == (400, "cancellation_reason")
    assert client.v1.payment_intents.retrieve(pi_id).status == "requires_capture"


def test_an_unknown_intent_is_resource_missing(client):
    error = stripe_error(lambda: client.v1.payment_intents.capture("pi_3nope"))
    assert (error.http_status, error.code) == (404, "resource_missing")


def test_the_hold_lapses_on_the_sandbox_clock_with_charge_expired_then_payment_intent_canceled(client, sandbox):
    sandbox.account(authorization_validity_seconds=3600)
    # Only the advances below move the sandbox's clock: one second before the lapse is one second
    # before it however long the machine takes between the hold and the advance.
    sandbox.sandbox.freeze_clock()
    _, pi_id = held(client, sandbox)
    sandbox.advance_clock(3599)
    assert client.v1.payment_intents.retrieve(pi_id).status == "requires_capture"

    sandbox.advance_clock(1)
    pi, charge = charge_of(client, pi_id)
    assert (pi.status, pi.cancellation_reason, pi.amount_capturable) == ("canceled", "automatic", 0)
    assert (charge.captured, charge.refunded) == (False, True)
    assert event_types(sandbox)[-2:] == ["charge.expired", "payment_intent.canceled"]
    [expired] = sandbox.events("charge.expired")
    assert expired["event"]["data"]["object"]["id"] == charge.id

    error = stripe_error(lambda: client.v1.payment_intents.capture(pi_id))
    assert error.code == "payment_intent_unexpected_state" and "status of canceled" in error.user_message


def test_the_new_endpoints_answer_the_outage_and_lock_timeout_faults(client, sandbox):
    _, pi_id = held(client, sandbox)
    sandbox.faults(api_unavailable=True)
    with pytest.raises(stripe.APIError) as outage:
        client.v1.payment_intents.capture(pi_id)
    assert outage.value.http_status == 503
    sandbox.faults(api_unavailable=False, lock_timeout=1)
    with pytest.raises(stripe.RateLimitError) as locked:
        client.v1.payment_intents.cancel(pi_id, options={"idempotency_key": "void-1"})
    assert locked.value.json_body["error"]["code"] == "lock_timeout"
    assert client.v1.payment_intents.retrieve(pi_id).status == "requires_capture"
    # Nothing ran, so the same key runs now.
    assert client.v1.payment_intents.cancel(pi_id, options={"idempotency_key": "void-1"}).status == "canceled"


def test_a_restarted_sandbox_keeps_the_hold_and_lets_it_lapse(client, sandbox, tmp_path):
    sandbox.account(authorization_validity_seconds=3600)
    _, pi_id = held(client, sandbox)
    path = tmp_path / "state.json"
    with sandbox.sandbox.lock:
        path.write_text(json.dumps(snapshot(sandbox.sandbox)))

    restarted = Sandbox(60, start_threads=False)
    StateFile(restarted, str(path)).load()
    pi = restarted.get_payment_intent(pi_id)
    charge = restarted.charges[pi.latest_charge or ""]
    assert (pi.status, pi.capture_method, pi.amount_capturable) == ("requires_capture", "manual", 2500)
    assert (charge.captured, charge.capture_before) == (False, sandbox.sandbox.charges[charge.id].capture_before)
    assert restarted.account.authorization_validity_seconds == 3600
    restarted.advance_clock(3600)
    assert (pi.status, pi.cancellation_reason) == ("canceled", "automatic")
    restarted.close()


def test_the_hosted_page_holds_a_payment_and_then_says_it_was_authorized_or_released(client, sandbox):
    session = client.v1.checkout.sessions.create(params={**session_params(), **CARD_MANUAL})
    path = urlsplit(session.url).path
    status, location, _ = browser(sandbox, "POST", path, {"choice": "pay"})
    assert status == 303 and location.startswith("http://shop.test/ok")
    pi_id = client.v1.checkout.sessions.retrieve(session.id).payment_intent
    assert client.v1.payment_intents.retrieve(pi_id).status == "requires_capture"
    assert "Your card is authorized" in browser(sandbox, "GET", path)[2]

    client.v1.payment_intents.cancel(pi_id)
    assert "was released. Nothing was charged" in browser(sandbox, "GET", path)[2]
