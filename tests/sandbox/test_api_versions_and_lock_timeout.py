"""Webhook endpoints record the API version their events are rendered in (the create param, else
the account's default_api_version), and the `lock_timeout` fault answers the next N writes to one
object with Stripe's 429 `lock_timeout`, which an Idempotency-Key does not keep, so a retry runs."""

import json

import pytest
import stripe

from sandbox.test_hosted_page_and_shapes import new_session
from sandbox.test_idempotency_and_refunds import paid_intent
from shop.stripe_sandbox.testing import SandboxControlError

HOOK = "http://127.0.0.1:9/hook"


def raw(obj) -> dict:
    return json.loads(obj.last_response.body)


# -- webhook endpoints' api_version ----------------------------------------------------------


def test_an_endpoint_created_without_a_version_gets_the_accounts_default_and_keeps_it(client, sandbox):
    first = client.v1.webhook_endpoints.create(params={"url": HOOK, "enabled_events": ["*"]})
    assert raw(first)["api_version"] == "2026-10-28.endive"

    sandbox.account(default_api_version="2026-09-30.endive")
    second = client.v1.webhook_endpoints.create(params={"url": HOOK, "enabled_events": ["*"]})

    assert second.api_version == "2026-09-30.endive"
    assert client.v1.webhook_endpoints.retrieve(first.id).api_version == "2026-10-28.endive"
    listed = {e.id: e.api_version for e in client.v1.webhook_endpoints.list().data}
    assert listed == {first.id: "2026-10-28.endive", second.id: "2026-09-30.endive"}


def test_an_endpoint_created_with_a_version_records_that_one(client, sandbox):
    endpoint = client.v1.webhook_endpoints.create(
        params={"url": HOOK, "enabled_events": ["*"], "api_version": "2025-03-31.basil"}
    )
    assert endpoint.api_version == "2025-03-31.basil"
    assert raw(client.v1.webhook_endpoints.retrieve(endpoint.id))["api_version"] == "2025-03-31.basil"


def test_a_malformed_api_version_is_refused_naming_the_param(client, sandbox):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.webhook_endpoints.create(params={"url": HOOK, "enabled_events": ["*"], "api_version": "newest"})
    assert refused.value.param == "api_version" and "newest" in refused.value.user_message
    assert client.v1.webhook_endpoints.list().data == []


def test_events_are_rendered_in_the_accounts_default_api_version(client, sandbox):
    sandbox.account(default_api_version="2026-09-30.endive")
    session = new_session(client)
    sandbox.set_outcome(session.id, "paid")

    event = client.v1.events.list(params={"type": "checkout.session.completed"}).data[0]
    assert event.api_version == "2026-09-30.endive"


# -- the lock_timeout fault ------------------------------------------------------------------


def test_the_next_n_writes_to_one_object_answer_a_429_lock_timeout_then_it_lets_go(client, sandbox):
    session = new_session(client)
    assert sandbox.faults(lock_timeout=2)["lock_timeout"] == 2

    for left in (1, 0):
        with pytest.raises(stripe.RateLimitError) as locked:
            client.v1.checkout.sessions.expire(session.id)
        assert locked.value.http_status == 429 and locked.value.json_body["error"]["code"] == "lock_timeout"
        assert locked.value.headers["Stripe-Should-Retry"] == "true"
        assert sandbox.faults()["lock_timeout"] == left
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"

    assert client.v1.checkout.sessions.expire(session.id).status == "expired"


def test_while_one_object_is_locked_reads_creates_and_writes_to_other_objects_go_through(client, sandbox):
    locked_session, other = new_session(client), new_session(client)
    sandbox.faults(lock_timeout=2)
    with pytest.raises(stripe.RateLimitError):
        client.v1.checkout.sessions.expire(locked_session.id)

    assert client.v1.checkout.sessions.retrieve(locked_session.id).status == "open"
    assert new_session(client).status == "open"
    assert client.v1.checkout.sessions.expire(other.id).status == "expired"
    with pytest.raises(stripe.RateLimitError):
        client.v1.checkout.sessions.expire(locked_session.id)
    assert client.v1.checkout.sessions.expire(locked_session.id).status == "expired"


def test_a_refund_locks_the_payment_it_is_taken_from_whether_named_by_intent_or_charge(client, sandbox):
    intent = paid_intent(client, sandbox)
    charge = client.v1.payment_intents.retrieve(intent).latest_charge
    sandbox.faults(lock_timeout=2)

    with pytest.raises(stripe.RateLimitError):
        client.v1.refunds.create(params={"payment_intent": intent, "amount": 100})
    with pytest.raises(stripe.RateLimitError):
        client.v1.refunds.create(params={"charge": charge, "amount": 100})
    assert client.v1.refunds.list().data == []

    assert client.v1.refunds.create(params={"charge": charge, "amount": 100}).status == "succeeded"


def test_a_lock_timeout_is_not_kept_for_the_idempotency_key_so_the_retry_runs(client, sandbox):
    intent = paid_intent(client, sandbox)
    sandbox.faults(lock_timeout=1)
    params = {"payment_intent": intent, "amount": 700}
    with pytest.raises(stripe.RateLimitError):
        client.v1.refunds.create(params=params, options={"idempotency_key": "refund-ORD-1-1"})

    refund = client.v1.refunds.create(params=params, options={"idempotency_key": "refund-ORD-1-1"})
    replayed = client.v1.refunds.create(params=params, options={"idempotency_key": "refund-ORD-1-1"})

    assert refund.status == "succeeded" and replayed.id == refund.id
    assert replayed.last_response.headers.get("Idempotent-Replayed") == "true"
    assert [r.id for r in client.v1.refunds.list().data] == [refund.id]


def test_the_sdk_retries_a_lock_timeout_by_itself_as_stripe_asks(sandbox):
    retrying = stripe.StripeClient("sk_test_sandbox", base_addresses={"api": sandbox.base_url}, max_network_retries=2)
    endpoint = retrying.v1.webhook_endpoints.create(params={"url": HOOK, "enabled_events": ["*"]})
    sandbox.faults(lock_timeout=1)

    updated = retrying.v1.webhook_endpoints.update(endpoint.id, params={"description": "after the lock"})

    assert updated.description == "after the lock"
    updates = sandbox.requests(method="POST", path_prefix=f"/v1/webhook_endpoints/{endpoint.id}")
    assert [call["status"] for call in updates] == [429, 200]


def test_a_reset_or_zero_releases_the_lock(client, sandbox):
    session = new_session(client)
    sandbox.faults(lock_timeout=5)
    with pytest.raises(stripe.RateLimitError):
        client.v1.checkout.sessions.expire(session.id)

    sandbox.faults(lock_timeout=0)
    assert client.v1.checkout.sessions.expire(session.id).status == "expired"
    sandbox.faults(lock_timeout=5)
    sandbox.reset()
    assert sandbox.faults()["lock_timeout"] == 0


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_a_bad_lock_timeout_is_a_400_naming_it(sandbox, value):
    with pytest.raises(SandboxControlError) as refused:
        sandbox.faults(lock_timeout=value)
    assert refused.value.status == 400 and refused.value.message.startswith("lock_timeout must be a whole number")
