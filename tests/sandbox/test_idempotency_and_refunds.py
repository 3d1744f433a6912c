"""Idempotency-Key replay and refund arithmetic, through the real stripe SDK."""

import pytest
import stripe


def session_params(amount=2500, reference="ORD-1"):
    return {
        "mode": "payment",
        "success_url": "http://shop.test/ok",
        "client_reference_id": reference,
        "line_items": [
            {
                "price_data": {"currency": "usd", "unit_amount": amount, "product_data": {"name": "Mug"}},
                "quantity": 1,
            }
        ],
    }


def paid_intent(client, sandbox, amount=2500):
    session = client.v1.checkout.sessions.create(params=session_params(amount))
    return sandbox.set_outcome(session.id, "paid")["payment_intent"]


# -- idempotency ---------------------------------------------------------------------


def test_a_replayed_create_returns_the_same_bytes_and_creates_nothing_new(client):
    options = {"idempotency_key": "order-42-attempt-1"}
    first = client.v1.checkout.sessions.create(params=session_params(), options=options)
    again = client.v1.checkout.sessions.create(params=session_params(), options=options)

    assert again.id == first.id
    assert again.last_response.body == first.last_response.body
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.last_response.headers
    assert [s.id for s in client.v1.checkout.sessions.list().data] == [first.id]


def test_a_reused_key_with_other_params_is_an_idempotency_error(client):
    options = {"idempotency_key": "order-42-attempt-1"}
    client.v1.checkout.sessions.create(params=session_params(2500), options=options)

    with pytest.raises(stripe.IdempotencyError) as refused:
        client.v1.checkout.sessions.create(params=session_params(9900), options=options)
    assert refused.value.http_status == 400
    assert "same parameters" in refused.value.user_message
    assert len(client.v1.checkout.sessions.list().data) == 1


def test_a_key_that_failed_validation_can_be_reused_once_corrected(client):
    options = {"idempotency_key": "fix-me"}
    broken = session_params()
    broken["line_items"][0]["quantity"] = 0
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.checkout.sessions.create(params=broken, options=options)

    session = client.v1.checkout.sessions.create(params=session_params(), options=options)
    assert session.status == "open"


def test_an_idempotent_refund_replay_creates_one_refund(client, sandbox):
    pi_id = paid_intent(client, sandbox)
    options = {"idempotency_key": "refund-order-42"}

    first = client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 1000}, options=options)
    again = client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 1000}, options=options)

    assert again.id == first.id
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    refunds = client.v1.refunds.list(params={"payment_intent": pi_id})
    assert [r.id for r in refunds.data] == [first.id]


# -- refunds -------------------------------------------------------------------------


def test_a_full_refund_succeeds_and_a_second_is_refused_as_already_refunded(client, sandbox):
    pi_id = paid_intent(client, sandbox, amount=2500)

    refund = client.v1.refunds.create(params={"payment_intent": pi_id, "reason": "requested_by_customer"})
    assert (refund.object, refund.status, refund.amount, refund.currency) == ("refund", "succeeded", 2500, "usd")
    assert refund.payment_intent == pi_id
    assert refund.charge == client.v1.payment_intents.retrieve(pi_id).latest_charge
    assert client.v1.refunds.retrieve(refund.id).amount == 2500

    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 1})
    assert refused.value.code == "charge_already_refunded"
    assert refused.value.http_status == 400
    assert len(client.v1.refunds.list(params={"payment_intent": pi_id}).data) == 1


def test_partial_refunds_cannot_exceed_what_is_left(client, sandbox):
    pi_id = paid_intent(client, sandbox, amount=2500)
    client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 1000})

    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 1600})
    assert (refused.value.code, refused.value.param) == ("amount_too_large", "amount")
    assert "($16.00)" in refused.value.user_message and "($15.00)" in refused.value.user_message

    rest = client.v1.refunds.create(params={"payment_intent": pi_id})
    assert rest.amount == 1500


def test_a_refund_by_charge_id_counts_against_the_same_payment(client, sandbox):
    pi_id = paid_intent(client, sandbox, amount=2500)
    charge_id = client.v1.payment_intents.retrieve(pi_id).latest_charge

    client.v1.refunds.create(params={"charge": charge_id, "amount": 2000})
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 501})
    assert refused.value.code == "amount_too_large"


def test_an_unpaid_intent_cannot_be_refunded(client, sandbox):
    session = client.v1.checkout.sessions.create(params=session_params())
    pi_id = sandbox.set_outcome(session.id, "async_pending")["payment_intent"]
    assert client.v1.payment_intents.retrieve(pi_id).status == "processing"

    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"payment_intent": pi_id})
    assert refused.value.param == "payment_intent"
    assert "does not have a successful charge to refund" in refused.value.user_message
    assert client.v1.refunds.list().data == []


def test_a_refund_for_an_unknown_intent_is_resource_missing(client):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"payment_intent": "pi_nope"})
    assert (refused.value.code, refused.value.param) == ("resource_missing", "payment_intent")


def test_a_session_expanded_to_its_latest_charge_says_how_much_was_refunded(client, sandbox):
    session = client.v1.checkout.sessions.create(params=session_params(2500))
    sandbox.set_outcome(session.id, "paid")
    expand = {"expand": ["payment_intent.latest_charge"]}

    charge = client.v1.checkout.sessions.retrieve(session.id, params=expand).payment_intent.latest_charge
    assert (charge.object, charge.status, charge.amount, charge.amount_refunded, charge.refunded) == (
        "charge",
        "succeeded",
        2500,
        0,
        False,
    )
    client.v1.refunds.create(params={"payment_intent": charge.payment_intent, "amount": 1000})
    charge = client.v1.checkout.sessions.retrieve(session.id, params=expand).payment_intent.latest_charge
    assert (charge.amount_refunded, charge.refunded) == (1000, False)
    client.v1.refunds.create(params={"payment_intent": charge.payment_intent})
    charge = client.v1.checkout.sessions.retrieve(session.id, params=expand).payment_intent.latest_charge
    assert (charge.amount_refunded, charge.refunded) == (2500, True)
    # Without the expansion the intent is its id, as at Stripe.
    assert isinstance(client.v1.checkout.sessions.retrieve(session.id).payment_intent, str)
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.checkout.sessions.retrieve(session.id, params={"expand": ["payment_intent.customer"]})
