"""Refunds that stay pending and settle later, the events they send (`refund.updated`, and
`refund.failed` for one that failed), their shapes against Stripe's example objects, and what the
API says about itself: errors leave out a null `code` and `param`, `enabled_events` takes `*` or
exact event types, a session may come back without a `url`."""

import http.client
import json
import os
from urllib.parse import urlsplit

import pytest
import stripe

from lane_priority import serving
from shop.stripe_sandbox.persist import StateFile, snapshot
from shop.stripe_sandbox.state import Sandbox
from shop.stripe_sandbox.testing import SandboxControlError, WebhookReceiver

from .test_hosted_page_and_shapes import raw
from .test_idempotency_and_refunds import paid_intent, session_params

REFUND_EVENTS = ["refund.updated", "refund.failed"]
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "stripe_examples.json")
JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}


@pytest.fixture
def receiver():
    with serving(WebhookReceiver) as r:
        yield r


@pytest.fixture
def endpoint(client, receiver):
    return client.v1.webhook_endpoints.create(params={"url": receiver.url, "enabled_events": REFUND_EVENTS})


def pending_refund(client, sandbox, amount=2500):
    """A paid payment refunded in full while `refunds_pending` is on; returns (intent id, refund)."""
    pi_id = paid_intent(client, sandbox, amount=amount)
    sandbox.faults(refunds_pending=True)
    return pi_id, client.v1.refunds.create(params={"payment_intent": pi_id})


def example(resource: str) -> dict:
    """Stripe's own example object (shared/stripe-fixtures, kept with the tests)."""
    with open(EXAMPLES) as f:
        return json.load(f)["resources"][resource]


def declared_fields(cls) -> set[str]:
    """The fields the stripe SDK's class declares (its type annotations, inherited ones too)."""
    return {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}


def assert_like_example(resource: str, body: dict, *, documented_elsewhere: dict | None = None):
    """Every top-level field is in Stripe's example object with the same JSON type (any type
    where the example has null), except fields Stripe documents but leaves out of an example in
    which they do not apply: those must be declared on the stripe SDK's own class."""
    sample = example(resource)
    for name, value in body.items():
        if name in (documented_elsewhere or {}):
            assert name in declared_fields(documented_elsewhere[name]), (
                f"{resource}.{name} is neither in the example nor on the SDK's class"
            )
            continue
        assert name in sample, f"{resource}.{name} is not in Stripe's example object"
        if value is not None and sample[name] is not None:
            assert JSON_TYPES[type(value)] == JSON_TYPES[type(sample[name])], f"{resource}.{name}"


# -- pending refunds and their outcome -------------------------------------------------


def test_a_refund_made_while_refunds_pending_is_on_stays_pending_and_its_money_stays_counted(client, sandbox):
    pi_id, refund = pending_refund(client, sandbox)

    assert refund.status == "pending"
    assert client.v1.refunds.retrieve(refund.id).status == "pending"
    # As at Stripe, money under a pending refund cannot be refunded a second time.
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"payment_intent": pi_id})
    assert refused.value.code == "charge_already_refunded"
    sandbox.faults(refunds_pending=False)
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.refunds.create(params={"payment_intent": pi_id, "amount": 1})


def test_a_pending_refund_that_succeeds_sends_refund_updated_only(client, sandbox, receiver, endpoint):
    _, refund = pending_refund(client, sandbox)

    settled = sandbox.refund_outcome(refund.id, "succeeded")

    assert settled["status"] == "succeeded" and "failure_reason" not in settled
    [delivery] = receiver.wait_for(1)
    event = stripe.Webhook.construct_event(delivery.body, delivery.signature, endpoint.secret)
    assert event.type == "refund.updated"
    body = delivery.json()
    assert body["data"]["object"]["id"] == refund.id and body["data"]["object"]["status"] == "succeeded"
    assert body["data"]["previous_attributes"] == {"status": "pending"}
    assert [e["type"] for e in sandbox.events() if e["type"].startswith("refund.")] == ["refund.updated"]
    assert client.v1.refunds.retrieve(refund.id).status == "succeeded"


def test_a_pending_refund_that_fails_says_why_sends_both_events_and_gives_the_money_back(
    client, sandbox, receiver, endpoint
):
    pi_id, refund = pending_refund(client, sandbox)

    failed = sandbox.refund_outcome(refund.id, "failed")

    assert (failed["status"], failed["failure_reason"]) == ("failed", "expired_or_canceled_card")
    # Two events, delivered each on its own (in no promised order, as at Stripe).
    deliveries = {d.json()["type"]: d for d in receiver.wait_for(2)}
    assert sorted(deliveries) == ["refund.failed", "refund.updated"]
    for delivery in deliveries.values():
        stripe.Webhook.construct_event(delivery.body, delivery.signature, endpoint.secret)
        assert delivery.json()["data"]["object"] == failed
    assert [e["type"] for e in sandbox.events() if e["type"].startswith("refund.")] == [
        "refund.updated",
        "refund.failed",
    ]  # emitted in this order
    assert deliveries["refund.updated"].json()["data"]["previous_attributes"] == {"status": "pending"}
    assert "previous_attributes" not in deliveries["refund.failed"].json()["data"]  # only *.updated has them
    again = client.v1.refunds.retrieve(refund.id)
    assert (again.status, again.failure_reason) == ("failed", "expired_or_canceled_card")
    # The failed refund's amount is unrefunded again: a new refund may take it, once.
    sandbox.faults(refunds_pending=False)
    retry = client.v1.refunds.create(params={"payment_intent": pi_id})
    assert (retry.status, retry.amount) == ("succeeded", 2500)
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.refunds.create(params={"payment_intent": pi_id})
    assert refused.value.code == "charge_already_refunded"


@pytest.mark.parametrize("outcome, status", [("canceled", 400), ("", 400), (None, 400)])
def test_the_refund_outcome_route_refuses_anything_but_succeeded_or_failed(client, sandbox, outcome, status):
    _, refund = pending_refund(client, sandbox)
    with pytest.raises(SandboxControlError) as refused:
        sandbox.refund_outcome(refund.id, outcome)
    assert refused.value.status == status and "succeeded, failed" in refused.value.message
    assert client.v1.refunds.retrieve(refund.id).status == "pending"
    assert sandbox.events("refund.updated") == []


def test_the_refund_outcome_route_refuses_an_unknown_refund_and_one_that_is_not_pending(client, sandbox):
    with pytest.raises(SandboxControlError) as unknown:
        sandbox.refund_outcome("re_nope", "failed")
    assert unknown.value.status == 404 and "re_nope" in unknown.value.message

    _, refund = pending_refund(client, sandbox)
    sandbox.refund_outcome(refund.id, "failed")
    with pytest.raises(SandboxControlError) as settled:
        sandbox.refund_outcome(refund.id, "succeeded")
    assert settled.value.status == 409 and "only a pending refund" in settled.value.message

    sandbox.faults(refunds_pending=False)
    at_once = client.v1.refunds.create(params={"payment_intent": paid_intent(client, sandbox)})
    with pytest.raises(SandboxControlError) as succeeded:
        sandbox.refund_outcome(at_once.id, "failed")
    assert succeeded.value.status == 409
    # The error shape of every control route: a type and a sentence.
    parts = urlsplit(sandbox.base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    conn.request(
        "POST",
        "/_sandbox/refunds/re_nope/outcome",
        body=b'{"outcome": "failed", "x": 1}',
        headers={"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 400 and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "sandbox_error"


# -- events: shapes, faults, the list ---------------------------------------------------


def test_refund_events_and_objects_have_stripes_field_names_and_types(client, sandbox, receiver, endpoint):
    _, refund = pending_refund(client, sandbox)
    assert_like_example("refund", raw(refund))
    sandbox.refund_outcome(refund.id, "failed")
    failed = raw(client.v1.refunds.retrieve(refund.id))
    # `failure_reason` is in Stripe's refund object only once a refund failed (its example succeeded).
    assert_like_example("refund", failed, documented_elsewhere={"failure_reason": stripe.Refund})
    assert isinstance(failed["failure_reason"], str)

    for delivery in receiver.wait_for(2):
        event = delivery.json()
        assert_like_example("event", event)
        assert set(event["data"]) <= declared_fields(stripe.Event.Data)  # object, previous_attributes
        assert_like_example("refund", event["data"]["object"], documented_elsewhere={"failure_reason": stripe.Refund})
        listed = raw(client.v1.events.retrieve(event["id"]))
        assert listed["data"] == event["data"] and listed["type"] == event["type"]
    records = [r for r in sandbox.events() if r["type"].startswith("refund.")]
    assert [(r["type"], r["object"], r["session"]) for r in records] == [
        ("refund.updated", refund.id, None),
        ("refund.failed", refund.id, None),
    ]


def test_refund_events_are_dropped_duplicated_and_reordered_like_any_other(client, sandbox, receiver, endpoint):
    first_pi, first = pending_refund(client, sandbox)
    _, second = pending_refund(client, sandbox)
    _, third = pending_refund(client, sandbox)

    sandbox.faults(drop_webhooks=1)
    sandbox.refund_outcome(first.id, "succeeded")  # refund.updated: dropped
    [dropped] = sandbox.events("refund.updated")
    assert dropped["dropped"] and [d["status"] for d in dropped["deliveries"]] == ["dropped"]

    sandbox.faults(duplicate_webhooks=True)
    sandbox.refund_outcome(second.id, "succeeded")
    copies = receiver.wait_for(2)
    assert [c.json()["data"]["object"]["id"] for c in copies] == [second.id, second.id]
    assert copies[0].json()["id"] == copies[1].json()["id"]

    sandbox.faults(duplicate_webhooks=False, reorder_webhooks=True)
    sandbox.refund_outcome(third.id, "failed")  # refund.updated, then refund.failed: held
    assert len(receiver.accepted()) == 2
    sandbox.faults(reorder_webhooks=False)
    released = receiver.wait_for(4)[2:]
    assert [d.json()["type"] for d in released] == ["refund.failed", "refund.updated"]  # newest first


def test_the_events_list_filters_refund_events_by_exact_type_and_by_a_trailing_wildcard(client, sandbox):
    _, refund = pending_refund(client, sandbox)
    sandbox.refund_outcome(refund.id, "failed")
    session = client.v1.checkout.sessions.create(params=session_params())
    client.v1.checkout.sessions.expire(session.id)

    assert [e.type for e in client.v1.events.list(params={"type": "refund.failed"}).data] == ["refund.failed"]
    assert [e.type for e in client.v1.events.list(params={"type": "refund.*"}).data] == [
        "refund.failed",
        "refund.updated",
    ]
    both = client.v1.events.list(params={"types": ["refund.updated", "checkout.session.*"]}).data
    assert [e.type for e in both] == ["checkout.session.expired", "refund.updated", "checkout.session.completed"]


def test_a_webhook_endpoint_takes_star_or_exact_event_types_not_a_wildcard_pattern(client, sandbox):
    exact = client.v1.webhook_endpoints.create(params={"url": "http://127.0.0.1:9/a", "enabled_events": REFUND_EVENTS})
    assert exact.enabled_events == REFUND_EVENTS
    every = client.v1.webhook_endpoints.create(params={"url": "http://127.0.0.1:9/b", "enabled_events": ["*"]})
    assert every.enabled_events == ["*"]
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.webhook_endpoints.create(params={"url": "http://127.0.0.1:9/c", "enabled_events": ["refund.*"]})
    assert refused.value.param == "enabled_events[0]"


def test_a_failed_refund_and_its_reason_survive_a_restart(client, sandbox, tmp_path):
    _, refund = pending_refund(client, sandbox)
    sandbox.refund_outcome(refund.id, "failed")
    _, still_pending = pending_refund(client, sandbox)
    path = tmp_path / "state.json"
    with sandbox.sandbox.lock:
        path.write_text(json.dumps(snapshot(sandbox.sandbox)))

    restarted = Sandbox(60, start_threads=False)
    StateFile(restarted, str(path)).load()
    try:
        assert (restarted.get_refund(refund.id).status, restarted.get_refund(refund.id).failure_reason) == (
            "failed",
            "expired_or_canceled_card",
        )
        assert restarted.get_refund(still_pending.id).status == "pending"
        assert restarted.faults.refunds_pending is False  # faults are not kept
        restarted.settle_refund(still_pending.id, "succeeded")
        assert restarted.get_refund(still_pending.id).status == "succeeded"
    finally:
        restarted.close()


# -- what the API says about itself -----------------------------------------------------


def _raw_call(sandbox, method: str, path: str, body: bytes = b"", key: str | None = "sk_test_sandbox"):
    parts = urlsplit(sandbox.base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    result = response.status, json.loads(response.read())
    conn.close()
    return result


def test_an_error_leaves_out_code_and_param_when_it_has_none_as_stripe_does(sandbox):
    status, body = _raw_call(sandbox, "GET", "/v1/checkout/sessions", key=None)
    assert status == 401 and set(body["error"]) == {"type", "message"}

    status, body = _raw_call(sandbox, "POST", "/v1/refunds", b"payment_intent=pi_nope")
    assert status == 400
    assert body["error"]["code"] == "resource_missing" and body["error"]["param"] == "payment_intent"

    status, body = _raw_call(sandbox, "POST", "/v1/refunds", b"amount=5")
    assert status == 400 and body["error"]["code"] == "parameter_missing" and "param" not in body["error"]

    sandbox.faults(api_unavailable=True)
    status, body = _raw_call(sandbox, "GET", "/v1/events")
    assert status == 503 and set(body["error"]) == {"type", "message"}


def test_a_session_made_while_checkout_url_null_is_on_has_no_url_and_still_takes_a_payment(client, sandbox):
    sandbox.faults(checkout_url_null=True)
    session = client.v1.checkout.sessions.create(params=session_params())
    assert session.url is None and raw(session)["url"] is None
    sandbox.faults(checkout_url_null=False)
    assert client.v1.checkout.sessions.retrieve(session.id).url is None  # it never gets one
    assert "/pay/cs_" in client.v1.checkout.sessions.create(params=session_params()).url  # later ones do
    assert sandbox.set_outcome(session.id, "paid")["payment_status"] == "paid"
