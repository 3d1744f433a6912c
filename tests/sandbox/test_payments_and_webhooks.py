"""Payment outcomes, the events they emit, and signed delivery to a real HTTP receiver."""

import time

import pytest
import stripe

from lane_priority import serving
from shop.stripe_sandbox.testing import WebhookReceiver, wait_until

CHECKOUT_EVENTS = [
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
]


@pytest.fixture
def receiver():
    with serving(WebhookReceiver) as r:
        yield r


@pytest.fixture
def endpoint(client, receiver):
    return client.v1.webhook_endpoints.create(params={"url": receiver.url, "enabled_events": CHECKOUT_EVENTS})


def new_session(client, **overrides):
    params = {
        "mode": "payment",
        "success_url": "http://shop.test/ok",
        "client_reference_id": "ORD-7",
        "metadata": {"order_id": "7"},
        "line_items": [
            {
                "price_data": {"currency": "eur", "unit_amount": 1999, "product_data": {"name": "Kettle"}},
                "quantity": 1,
            }
        ],
    }
    params.update(overrides)
    return client.v1.checkout.sessions.create(params=params)


def verified(delivery, secret):
    """What a receiver does: verify the signature and build the event (SDK code)."""
    return stripe.Webhook.construct_event(delivery.body, delivery.signature, secret)


def test_paid_emits_completed_delivered_with_a_signature_the_sdk_verifies(client, sandbox, receiver, endpoint):
    session = new_session(client)
    sandbox.set_outcome(session.id, "paid")

    [delivery] = receiver.wait_for(1)
    event = verified(delivery, endpoint.secret)
    assert event.type == "checkout.session.completed"
    assert event.data.object.id == session.id
    assert event.data.object.payment_status == "paid"
    assert event.data.object.client_reference_id == "ORD-7"
    assert event.livemode is False and event.id.startswith("evt_")

    # The same event is listed by the API, and the intent carries the session's metadata.
    assert client.v1.events.retrieve(event.id).type == "checkout.session.completed"
    pi = client.v1.payment_intents.retrieve(event.data.object.payment_intent)
    assert (pi.status, pi.amount, pi.amount_received, pi.currency) == ("succeeded", 1999, 1999, "eur")
    assert pi.latest_charge.startswith("ch_")
    assert pi.metadata.to_dict() == {"order_id": "7"}

    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(delivery.body, delivery.signature, "whsec_wrong")


def test_async_pending_completes_unpaid_then_succeeds(client, sandbox, receiver, endpoint):
    session = new_session(client)
    pending = sandbox.set_outcome(session.id, "async_pending")
    assert (pending["status"], pending["payment_status"]) == ("complete", "unpaid")
    assert client.v1.payment_intents.retrieve(pending["payment_intent"]).status == "processing"

    sandbox.async_result(session.id, "succeeded")

    events = [verified(d, endpoint.secret) for d in receiver.wait_for(2)]
    by_type = {e.type: e for e in events}
    assert by_type["checkout.session.completed"].data.object.payment_status == "unpaid"
    assert by_type["checkout.session.async_payment_succeeded"].data.object.payment_status == "paid"
    assert client.v1.checkout.sessions.retrieve(session.id).payment_status == "paid"
    assert client.v1.payment_intents.retrieve(pending["payment_intent"]).status == "succeeded"


def test_async_pending_then_failed_stays_unpaid(client, sandbox, receiver, endpoint):
    session = new_session(client)
    pi_id = sandbox.set_outcome(session.id, "async_pending")["payment_intent"]
    sandbox.async_result(session.id, "failed")

    failed = sandbox.wait_for_event("checkout.session.async_payment_failed")[0]
    assert failed["event"]["data"]["object"]["payment_status"] == "unpaid"
    retrieved = client.v1.checkout.sessions.retrieve(session.id)
    assert (retrieved.status, retrieved.payment_status) == ("complete", "unpaid")
    pi = client.v1.payment_intents.retrieve(pi_id)
    assert pi.status == "requires_payment_method" and pi.amount_received == 0


def test_a_decline_leaves_the_session_open_and_emits_only_the_payment_failure(client, sandbox, receiver, endpoint):
    session = new_session(client)
    declined = sandbox.set_outcome(session.id, "declined")
    assert (declined["status"], declined["payment_status"]) == ("open", "unpaid")
    pi = client.v1.payment_intents.retrieve(declined["payment_intent"])
    assert pi.status == "requires_payment_method"
    assert pi.last_payment_error.code == "card_declined"

    # Stripe tells of the failed attempt (its PaymentIntent, with the card error), not of the
    # session: an endpoint that listens to checkout events only hears nothing of it.
    [failure] = sandbox.events("payment_intent.payment_failed")
    assert failure["event"]["data"]["object"]["last_payment_error"]["code"] == "card_declined"

    # The customer tries again and pays.
    sandbox.set_outcome(session.id, "paid")
    [delivery] = receiver.wait_for(1)
    assert verified(delivery, endpoint.secret).type == "checkout.session.completed"
    assert [e["type"] for e in sandbox.events()] == ["payment_intent.payment_failed", "checkout.session.completed"]


def test_advancing_the_clock_expires_an_open_session_and_emits_expired(client, sandbox, receiver, endpoint):
    session = new_session(client, expires_at=int(time.time()) + 120)
    sandbox.advance_clock(60)
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"

    sandbox.advance_clock(61)

    assert client.v1.checkout.sessions.retrieve(session.id).status == "expired"
    [delivery] = receiver.wait_for(1)
    event = verified(delivery, endpoint.secret)  # signed with real time despite the clock
    assert event.type == "checkout.session.expired"
    assert event.data.object.status == "expired"
    assert event.created >= session.expires_at
    assert event.request.id is None


def test_expiry_by_api_records_the_request_on_the_event(client, sandbox, receiver, endpoint):
    session = new_session(client)
    client.v1.checkout.sessions.expire(session.id, options={"idempotency_key": "expire-7"})

    event = client.v1.events.list(params={"type": "checkout.session.expired"}).data[0]
    assert event.data.object.id == session.id
    assert event.request.idempotency_key == "expire-7"
    assert event.request.id.startswith("req_")


def test_events_list_newest_first_and_filters_by_type(client, sandbox):
    first, second = new_session(client), new_session(client)
    sandbox.set_outcome(first.id, "paid")
    client.v1.checkout.sessions.expire(second.id)

    assert [e.type for e in client.v1.events.list().data] == [
        "checkout.session.expired",
        "checkout.session.completed",
    ]
    completed = client.v1.events.list(params={"type": "checkout.session.completed"}).data
    assert [e.data.object.id for e in completed] == [first.id]
    assert len(client.v1.events.list(params={"type": "checkout.session.*"}).data) == 2


def test_a_receiver_that_fails_twice_is_retried_with_backoff_until_it_answers_200(client, sandbox, receiver, endpoint):
    receiver.fail_next(2, status=500)
    session = new_session(client)
    sandbox.set_outcome(session.id, "paid")

    [accepted] = receiver.wait_for(1, timeout=6)
    assert [r.status for r in receiver.received] == [500, 500, 200]
    assert verified(accepted, endpoint.secret).data.object.id == session.id

    record = sandbox.wait_for_event("checkout.session.completed")[0]
    [delivery] = record["deliveries"]
    assert delivery["status"] == "succeeded"
    attempts = delivery["attempts"]
    assert [a["status_code"] for a in attempts] == [500, 500, 200]
    gaps = [later["at"] - earlier["at"] for earlier, later in zip(attempts, attempts[1:], strict=False)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.9  # 0.5 s, then 1 s


def test_an_unreachable_endpoint_records_connection_errors(client, sandbox):
    dead = WebhookReceiver()
    url = dead.url
    dead.close()
    client.v1.webhook_endpoints.create(params={"url": url, "enabled_events": ["*"]})
    sandbox.set_outcome(new_session(client).id, "paid")

    def failed_attempt():
        [record] = sandbox.events()
        attempts = record["deliveries"][0]["attempts"]
        return attempts if attempts else None

    [attempt, *_] = wait_until(failed_attempt, timeout=3)
    assert attempt["status_code"] is None and "Connection" in attempt["error"]
    assert client.v1.events.list().data[0].pending_webhooks == 1
