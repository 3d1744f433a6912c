"""Checkout Sessions through the real stripe SDK against the sandbox over HTTP."""

import http.client
import json
import time
from urllib.parse import urlsplit

import pytest
import stripe

MIN_SESSION_SECONDS = 60


def session_params(**overrides):
    params = {
        "mode": "payment",
        "success_url": "http://shop.test/checkout/return?session_id={CHECKOUT_SESSION_ID}",
        "cancel_url": "http://shop.test/cart",
        "client_reference_id": "ORD-1",
        "customer_email": "ada@example.com",
        "metadata": {"order_id": "42"},
        "line_items": [
            {
                "price_data": {"currency": "usd", "unit_amount": 1250, "product_data": {"name": "Mug"}},
                "quantity": 2,
            },
            {
                "price_data": {"currency": "usd", "unit_amount": 500, "product_data": {"name": "Tea"}},
                "quantity": 1,
            },
        ],
    }
    params.update(overrides)
    return params


def test_a_created_session_is_open_unpaid_with_totals_and_a_pay_url(client, sandbox):
    session = client.v1.checkout.sessions.create(params=session_params())

    assert session.id.startswith("cs_test_")
    assert session.object == "checkout.session"
    assert (session.status, session.payment_status, session.mode) == ("open", "unpaid", "payment")
    assert (session.amount_subtotal, session.amount_total, session.currency) == (3000, 3000, "usd")
    assert session.url == f"{sandbox.base_url}/pay/{session.id}"
    assert session.client_reference_id == "ORD-1"
    assert session.metadata.to_dict() == {"order_id": "42"}
    assert session.payment_intent is None
    # Default lifetime is 24 hours from creation on the sandbox clock.
    assert session.expires_at - session.created == 24 * 3600


def test_retrieve_and_list_return_the_stored_session(client):
    first = client.v1.checkout.sessions.create(params=session_params(client_reference_id="A"))
    second = client.v1.checkout.sessions.create(params=session_params(client_reference_id="B"))

    assert client.v1.checkout.sessions.retrieve(first.id).client_reference_id == "A"
    listed = client.v1.checkout.sessions.list()
    assert [s.id for s in listed.data] == [second.id, first.id]  # newest first
    assert listed.has_more is False

    page = client.v1.checkout.sessions.list(params={"limit": 1})
    assert [s.id for s in page.data] == [second.id] and page.has_more is True
    rest = client.v1.checkout.sessions.list(params={"limit": 1, "starting_after": second.id})
    assert [s.id for s in rest.data] == [first.id] and rest.has_more is False


def test_list_filters_by_payment_intent(client, sandbox):
    paid = client.v1.checkout.sessions.create(params=session_params())
    client.v1.checkout.sessions.create(params=session_params())
    pi_id = sandbox.set_outcome(paid.id, "paid")["payment_intent"]

    found = client.v1.checkout.sessions.list(params={"payment_intent": pi_id})
    assert [s.id for s in found.data] == [paid.id]
    expanded = client.v1.checkout.sessions.retrieve(paid.id, params={"expand": ["payment_intent"]})
    assert expanded.payment_intent.id == pi_id
    assert expanded.payment_intent.status == "succeeded"


def test_expire_closes_an_open_session_and_refuses_a_second_time(client, sandbox):
    session = client.v1.checkout.sessions.create(params=session_params())

    expired = client.v1.checkout.sessions.expire(session.id)
    assert (expired.status, expired.payment_status, expired.url) == ("expired", "unpaid", None)
    assert [e["type"] for e in sandbox.events()] == ["checkout.session.expired"]

    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.checkout.sessions.expire(session.id)
    assert refused.value.http_status == 400
    assert "This Checkout Session has a status of `expired`" in refused.value.user_message


def test_a_paid_session_cannot_be_expired(client, sandbox):
    session = client.v1.checkout.sessions.create(params=session_params())
    sandbox.set_outcome(session.id, "paid")

    with pytest.raises(stripe.InvalidRequestError, match="status of `complete`"):
        client.v1.checkout.sessions.expire(session.id)
    assert client.v1.checkout.sessions.retrieve(session.id).payment_status == "paid"


def test_expires_at_before_the_minimum_lifetime_is_refused_on_param_expires_at(client):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.checkout.sessions.create(
            params=session_params(expires_at=int(time.time()) + MIN_SESSION_SECONDS - 10)
        )
    assert refused.value.param == "expires_at"
    assert refused.value.http_status == 400
    assert "at least 1 minute" in refused.value.user_message
    assert client.v1.checkout.sessions.list().data == []


def test_expires_at_beyond_24_hours_is_refused_and_a_valid_one_is_kept(client):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.checkout.sessions.create(params=session_params(expires_at=int(time.time()) + 24 * 3600 + 60))
    assert refused.value.param == "expires_at"

    expires_at = int(time.time()) + MIN_SESSION_SECONDS + 30
    session = client.v1.checkout.sessions.create(params=session_params(expires_at=expires_at))
    assert session.expires_at == expires_at


def test_an_unknown_session_is_resource_missing(client):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.checkout.sessions.retrieve("cs_test_nope")
    assert refused.value.code == "resource_missing"
    assert refused.value.http_status == 404
    assert "No such checkout.session: 'cs_test_nope'" in refused.value.user_message


def test_line_items_must_share_one_currency_and_name_the_bad_param(client):
    items = session_params()["line_items"]
    items[1]["price_data"]["currency"] = "eur"
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.checkout.sessions.create(params=session_params(line_items=items))
    assert refused.value.param == "line_items[1][price_data][currency]"


def test_missing_line_items_and_unknown_params_are_refused_like_stripe(client):
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.checkout.sessions.create(params=session_params(line_items=None))
    assert (missing.value.code, missing.value.param) == ("parameter_missing", "line_items")

    with pytest.raises(stripe.InvalidRequestError) as unknown:
        client.v1.checkout.sessions.create(params=session_params(colour="red"))
    assert (unknown.value.code, unknown.value.param) == ("parameter_unknown", "colour")


def test_a_wrong_api_key_is_an_authentication_error(sandbox):
    bad = stripe.StripeClient("pk_test_public", base_addresses={"api": sandbox.base_url})
    with pytest.raises(stripe.AuthenticationError) as refused:
        bad.v1.checkout.sessions.list()
    assert refused.value.http_status == 401


def test_no_authorization_header_is_a_stripe_401(sandbox):
    parts = urlsplit(sandbox.base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    conn.request("GET", "/v1/checkout/sessions")
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 401
    assert body["error"]["type"] == "invalid_request_error"
    assert "You did not provide an API key" in body["error"]["message"]


def test_an_unknown_route_is_stripe_unrecognized_url(client):
    with pytest.raises(stripe.InvalidRequestError, match="Unrecognized request URL"):
        client.raw_request("get", "/v1/checkout/nothing")


def test_a_unit_amount_over_eight_digits_is_refused_like_stripe(client):
    params = session_params()
    params["line_items"][0]["price_data"]["unit_amount"] = 100_000_000
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.checkout.sessions.create(params=params)
    assert refused.value.code == "parameter_invalid_integer"
    assert refused.value.param == "line_items[0][price_data][unit_amount]"
    params["line_items"][0]["price_data"]["unit_amount"] = 99_999_999
    assert client.v1.checkout.sessions.create(params=params).amount_total == 99_999_999 * 2 + 500
