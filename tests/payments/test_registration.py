"""Webhook endpoint self-registration (`flask shop stripe-register-webhook`) against the
sandbox: it creates our endpoint and stores its secret, is idempotent, cleans up only the
endpoints it marked as its own, and never touches one a person created."""

from __future__ import annotations

import pytest

from shop.extensions import db
from shop.models import KeyValue
from shop.provider import gateway
from shop.provider.registration import MARKER, register_webhook

BASE = "https://shop.example.com"
TARGET = BASE + "/webhooks/stripe"


@pytest.fixture
def fresh_app(make_fresh_app, sandbox):
    return make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET=None, PUBLIC_BASE_URL=BASE)


@pytest.fixture
def sdk(fresh_app):
    with fresh_app.app_context():
        yield gateway.client()


def _register(app) -> list[str]:
    with app.app_context():
        lines = register_webhook()
        db.session.remove()
        return lines


def _stored(app) -> dict:
    with app.app_context():
        values = {row.key: row.value for row in db.session.query(KeyValue)}
        db.session.remove()
        return values


def _endpoints(sdk) -> dict[str, dict]:
    return {e["id"]: e.to_dict() for e in sdk.v1.webhook_endpoints.list(params={"limit": 100}).auto_paging_iter()}


def _secret_at_sandbox(sandbox, endpoint_id) -> str:
    with sandbox.sandbox.lock:  # the API reveals a secret only once, at creation
        return sandbox.sandbox.endpoints[endpoint_id].secret


def test_registration_creates_a_marked_endpoint_for_the_events_the_shop_uses_and_stores_its_secret(
    fresh_app, sdk, sandbox
):
    lines = _register(fresh_app)
    [endpoint] = _endpoints(sdk).values()
    assert endpoint["url"] == TARGET and endpoint["status"] == "enabled"
    assert sorted(endpoint["enabled_events"]) == sorted(gateway.EVENT_TYPES)
    assert endpoint["description"].startswith(MARKER)
    stored = _stored(fresh_app)
    assert stored["stripe_webhook_endpoint_id"] == endpoint["id"]
    assert stored["stripe_webhook_secret"] == _secret_at_sandbox(sandbox, endpoint["id"])
    assert stored["stripe_webhook_secret"].startswith("whsec_")
    assert any("registered endpoint" in line for line in lines)


def test_registering_again_changes_nothing(fresh_app, sdk):
    _register(fresh_app)
    before_endpoints, before_stored = _endpoints(sdk), _stored(fresh_app)
    lines = _register(fresh_app)
    assert _endpoints(sdk) == before_endpoints
    assert _stored(fresh_app) == before_stored
    assert any("already registered" in line for line in lines)


def test_our_endpoint_whose_secret_was_lost_is_replaced(fresh_app, sdk, sandbox):
    _register(fresh_app)
    [old] = _endpoints(sdk)
    with fresh_app.app_context():
        db.session.query(KeyValue).delete()
        db.session.commit()
    _register(fresh_app)
    [new] = _endpoints(sdk)
    assert new != old
    assert _stored(fresh_app)["stripe_webhook_secret"] == _secret_at_sandbox(sandbox, new)


def test_only_our_stale_endpoints_are_deleted_and_a_persons_endpoint_is_never_touched(fresh_app, sdk):
    events = gateway.EVENT_TYPES
    ours_elsewhere = sdk.v1.webhook_endpoints.create(
        params={
            "url": "https://old-host.example.com/webhooks/stripe",
            "enabled_events": events,
            "description": f"{MARKER} Backstop shop at https://old-host.example.com",
        }
    )
    ours_disabled = sdk.v1.webhook_endpoints.create(
        params={"url": TARGET, "enabled_events": events, "description": f"{MARKER} Backstop shop at {BASE}"}
    )
    sdk.v1.webhook_endpoints.update(ours_disabled["id"], params={"disabled": True})
    persons = sdk.v1.webhook_endpoints.create(
        params={
            "url": "https://analytics.example.com/hook",
            "enabled_events": ["*"],
            "description": "Finance team export",
        }
    )
    persons_here = sdk.v1.webhook_endpoints.create(
        params={"url": TARGET, "enabled_events": events, "description": "added by hand in the dashboard"}
    )
    persons_disabled = sdk.v1.webhook_endpoints.create(
        params={"url": "https://elsewhere.example.com/x", "enabled_events": events}
    )
    sdk.v1.webhook_endpoints.update(persons_disabled["id"], params={"disabled": True})
    untouched = {e: _endpoints(sdk)[e] for e in (persons["id"], persons_here["id"], persons_disabled["id"])}

    _register(fresh_app)
    _register(fresh_app)

    after = _endpoints(sdk)
    assert ours_elsewhere["id"] not in after and ours_disabled["id"] not in after
    for endpoint_id, before in untouched.items():
        assert after[endpoint_id] == before
    [ours] = [e for e in after.values() if (e["description"] or "").startswith(MARKER)]
    assert (ours["url"], ours["status"]) == (TARGET, "enabled")
    assert len(after) == 4


def test_an_endpoint_registered_before_refund_events_existed_is_subscribed_to_them_keeping_its_secret(fresh_app, sdk):
    """An upgrade must not leave the shop deaf to refund.updated / refund.failed: registering
    again adds them to the shop's own endpoint, whose signing secret stays the one stored."""
    _register(fresh_app)
    [endpoint_id] = _endpoints(sdk)
    older = [e for e in gateway.EVENT_TYPES if not e.startswith("refund.")]
    sdk.v1.webhook_endpoints.update(endpoint_id, params={"enabled_events": older})
    stored = _stored(fresh_app)

    lines = _register(fresh_app)

    [endpoint] = _endpoints(sdk).values()
    assert endpoint["id"] == endpoint_id and sorted(endpoint["enabled_events"]) == sorted(gateway.EVENT_TYPES)
    assert "refund.updated" in endpoint["enabled_events"] and "refund.failed" in endpoint["enabled_events"]
    assert _stored(fresh_app) == stored
    assert any("now also sends refund.updated, refund.failed" in line for line in lines)
    assert any("already registered" in line for line in _register(fresh_app))
