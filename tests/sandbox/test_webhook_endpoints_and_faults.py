"""Webhook endpoint management and scripted faults (drop, duplicate, reorder, delay, outage)."""

import http.client
import time
from urllib.parse import urlsplit

import pytest
import stripe

from lane_priority import serving
from shop.stripe_sandbox.testing import SandboxControlError, WebhookReceiver, wait_until


@pytest.fixture
def receiver():
    with serving(WebhookReceiver) as r:
        yield r


@pytest.fixture
def endpoint(client, receiver):
    return client.v1.webhook_endpoints.create(params={"url": receiver.url, "enabled_events": ["*"]})


def new_session(client):
    return client.v1.checkout.sessions.create(
        params={
            "mode": "payment",
            "success_url": "http://shop.test/ok",
            "line_items": [
                {
                    "price_data": {"currency": "usd", "unit_amount": 700, "product_data": {"name": "Pen"}},
                    "quantity": 3,
                }
            ],
        }
    )


def event_ids(deliveries):
    return [d.json()["id"] for d in deliveries]


def events_settled(sandbox) -> bool:
    """Some event exists and none of its deliveries is still to be made (each has succeeded, or
    was never made: an endpoint not subscribed or disabled gets none): nothing more will arrive."""
    records = sandbox.events()
    return bool(records) and all(d["status"] != "pending" for r in records for d in r["deliveries"])


def _scheduled_not_sent(sandbox) -> bool:
    deliveries = [d for r in sandbox.events() for d in r["deliveries"]]
    return bool(deliveries) and all(d["status"] == "pending" and not d["attempts"] for d in deliveries)


# -- webhook endpoints ---------------------------------------------------------------


def test_the_secret_is_shown_only_when_the_endpoint_is_created(client, receiver):
    created = client.v1.webhook_endpoints.create(
        params={
            "url": receiver.url,
            "enabled_events": ["checkout.session.completed"],
            "description": "shop",
            "metadata": {"env": "test"},
        }
    )
    assert created.secret.startswith("whsec_")
    assert (created.status, created.url, created.description) == ("enabled", receiver.url, "shop")
    assert created.enabled_events == ["checkout.session.completed"]

    retrieved = client.v1.webhook_endpoints.retrieve(created.id)
    listed = client.v1.webhook_endpoints.list().data
    updated = client.v1.webhook_endpoints.update(created.id, params={"description": "renamed"})
    assert "secret" not in retrieved and "secret" not in updated
    assert [e.id for e in listed] == [created.id] and "secret" not in listed[0]
    assert updated.description == "renamed" and updated.metadata.to_dict() == {"env": "test"}


def test_an_endpoint_needs_a_url_and_events(client, receiver):
    with pytest.raises(stripe.InvalidRequestError) as no_events:
        client.v1.webhook_endpoints.create(params={"url": receiver.url})
    assert no_events.value.param == "enabled_events"
    with pytest.raises(stripe.InvalidRequestError) as bad_url:
        client.v1.webhook_endpoints.create(params={"url": "not a url", "enabled_events": ["*"]})
    assert bad_url.value.param == "url"


def test_a_disabled_endpoint_gets_nothing_until_re_enabled(client, sandbox, receiver, endpoint):
    disabled = client.v1.webhook_endpoints.update(endpoint.id, params={"disabled": True})
    assert disabled.status == "disabled"
    sandbox.set_outcome(new_session(client).id, "paid")
    wait_until(lambda: events_settled(sandbox), what="the paid session's event, sent to no endpoint")
    assert receiver.received == []

    assert client.v1.webhook_endpoints.update(endpoint.id, params={"disabled": False}).status == "enabled"
    sandbox.set_outcome(new_session(client).id, "paid")
    assert len(receiver.wait_for(1)) == 1


def test_a_deleted_endpoint_is_gone(client, endpoint):
    deleted = client.v1.webhook_endpoints.delete(endpoint.id)
    assert (deleted.id, deleted.deleted) == (endpoint.id, True)
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.webhook_endpoints.retrieve(endpoint.id)
    assert refused.value.code == "resource_missing"
    assert client.v1.webhook_endpoints.list().data == []


def test_only_subscribed_event_types_are_delivered(client, sandbox, receiver):
    client.v1.webhook_endpoints.create(params={"url": receiver.url, "enabled_events": ["checkout.session.expired"]})
    sandbox.set_outcome(new_session(client).id, "paid")
    expiring = new_session(client)
    client.v1.checkout.sessions.expire(expiring.id)

    [delivery] = receiver.wait_for(1)
    assert delivery.json()["type"] == "checkout.session.expired"
    wait_until(lambda: events_settled(sandbox), what="every delivery settled at the sandbox")
    assert len(receiver.received) == 1


# -- faults --------------------------------------------------------------------------


def test_drop_webhooks_swallows_the_next_n_events_only(client, sandbox, receiver, endpoint):
    sandbox.faults(drop_webhooks=1)
    first, second = new_session(client), new_session(client)
    sandbox.set_outcome(first.id, "paid")
    sandbox.set_outcome(second.id, "paid")

    [delivery] = receiver.wait_for(1)
    assert delivery.json()["data"]["object"]["id"] == second.id
    records = sandbox.events()
    assert [r["dropped"] for r in records] == [True, False]
    assert records[0]["deliveries"][0]["status"] == "dropped"
    # The dropped event is still there for anyone who reconciles through the API.
    listed = client.v1.events.list(params={"type": "checkout.session.completed"}).data
    assert {e.data.object.id for e in listed} == {first.id, second.id}
    assert sandbox.faults()["drop_webhooks"] == 0


def test_duplicate_webhooks_delivers_every_event_twice(client, sandbox, receiver, endpoint):
    sandbox.faults(duplicate_webhooks=True)
    sandbox.set_outcome(new_session(client).id, "paid")

    deliveries = receiver.wait_for(2)
    assert len(set(event_ids(deliveries))) == 1
    for delivery in deliveries:
        stripe.Webhook.construct_event(delivery.body, delivery.signature, endpoint.secret)
    wait_until(lambda: events_settled(sandbox), what="every delivery settled at the sandbox")
    assert len(receiver.received) == 2


def test_reorder_holds_events_and_releases_them_newest_first(client, sandbox, receiver, endpoint):
    sandbox.faults(reorder_webhooks=True)
    paid, expiring = new_session(client), new_session(client)
    sandbox.set_outcome(paid.id, "paid")
    client.v1.checkout.sessions.expire(expiring.id)
    wait_until(lambda: len(sandbox.events()) == 2, what="both events, their deliveries held")
    assert receiver.received == []
    assert {d["status"] for r in sandbox.events() for d in r["deliveries"]} == {"held"}

    sandbox.faults(reorder_webhooks=False)

    deliveries = receiver.wait_for(2)
    assert [d.json()["type"] for d in deliveries] == [
        "checkout.session.expired",
        "checkout.session.completed",
    ]


def test_webhook_delay_holds_the_first_attempt(client, sandbox, receiver, endpoint):
    sandbox.faults(webhook_delay_seconds=0.6)
    started = time.monotonic()
    sandbox.set_outcome(new_session(client).id, "paid")
    wait_until(lambda: _scheduled_not_sent(sandbox), what="the first attempt scheduled, not yet made")
    assert receiver.received == []
    receiver.wait_for(1)
    assert time.monotonic() - started >= 0.55


def test_api_unavailable_answers_every_call_with_a_503_api_error(client, sandbox):
    session = new_session(client)
    sandbox.faults(api_unavailable=True)

    with pytest.raises(stripe.APIError) as outage:
        client.v1.checkout.sessions.retrieve(session.id)
    assert outage.value.http_status == 503
    assert outage.value.json_body["error"]["type"] == "api_error"
    with pytest.raises(stripe.APIError):
        new_session(client)

    sandbox.faults(api_unavailable=False)
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"
    assert len(client.v1.checkout.sessions.list().data) == 1


def test_reset_forgets_objects_faults_and_the_clock(client, sandbox, endpoint):
    new_session(client)
    sandbox.faults(drop_webhooks=3, duplicate_webhooks=True)
    sandbox.advance_clock(3600)

    sandbox.reset()

    assert client.v1.checkout.sessions.list().data == []
    assert client.v1.webhook_endpoints.list().data == []
    assert sandbox.faults() == {
        "drop_webhooks": 0,
        "duplicate_webhooks": False,
        "reorder_webhooks": False,
        "webhook_delay_seconds": 0.0,
        "refunds_pending": False,
        "checkout_url_null": False,
        "api_unavailable": False,
        "api_latency_seconds": 0.0,
        "api_latency_jitter_seconds": 0.0,
        "api_hang": False,
        "api_rate_limit_per_second": 0,
        "api_endpoint_rate_limit_per_second": 0,
        "api_rate_limit_next_calls": 0,
        "lock_timeout": 0,
    }
    assert abs(sandbox.get("/_sandbox/clock")["now"] - time.time()) < 5


# -- control route input -------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/_sandbox/faults", {"drop_webhooks": -1}, 400),
        ("/_sandbox/faults", {"drop_webhooks": True}, 400),
        ("/_sandbox/faults", {"duplicate_webhooks": "yes"}, 400),
        ("/_sandbox/faults", {"explode": True}, 400),
        ("/_sandbox/clock", {"advance_seconds": -5}, 400),
        ("/_sandbox/clock", {}, 400),
        ("/_sandbox/sessions/cs_test_nope/outcome", {"outcome": "paid"}, 404),
        ("/_sandbox/sessions/cs_test_nope/outcome", {"outcome": "stolen"}, 400),
        ("/_sandbox/sessions/cs_test_nope/async", {"result": "maybe"}, 400),
    ],
)
def test_bad_control_input_is_a_clear_4xx(sandbox, path, body, status):
    with pytest.raises(SandboxControlError) as refused:
        sandbox.request("POST", path, body)
    assert refused.value.status == status
    assert refused.value.message


def test_malformed_json_and_wrong_state_are_refused(client, sandbox):
    parts = urlsplit(sandbox.base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    conn.request("POST", "/_sandbox/faults", body=b"{not json", headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 400 and b"JSON object" in response.read()
    conn.close()

    session = new_session(client)
    client.v1.checkout.sessions.expire(session.id)
    with pytest.raises(SandboxControlError) as expired:
        sandbox.set_outcome(session.id, "paid")
    assert expired.value.status == 409
    with pytest.raises(SandboxControlError) as not_pending:
        sandbox.async_result(session.id, "succeeded")
    assert not_pending.value.status == 409


@pytest.mark.parametrize(
    "path, body",
    [
        ("/_sandbox/clock", {"advance_seconds": 1e308}),
        ("/_sandbox/clock", {"advance_seconds": -1}),
        ("/_sandbox/faults", {"webhook_delay_seconds": 1e308}),
    ],
)
def test_a_clock_step_or_delay_past_any_meaning_is_refused_and_changes_nothing(sandbox, path, body):
    before = sandbox.get("/_sandbox/clock")
    with pytest.raises(SandboxControlError) as refused:
        sandbox.request("POST", path, body)
    assert refused.value.status == 400
    assert sandbox.get("/_sandbox/clock")["offset_seconds"] == before["offset_seconds"]
