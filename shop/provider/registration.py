"""Webhook endpoint self-registration.

The provider reveals a signing secret only when an endpoint is created, so the new secret is
stored at once in the shared store (kv_store) that every process reads. Only endpoints whose
description carries our marker are ever deleted, and only when they point elsewhere or are
disabled: an endpoint a person created is never touched. It also owns reading that secret
(`webhook_secret`), so the webhook depends on payments and never the other way round.
"""

from __future__ import annotations

import time

from flask import current_app

from ..extensions import db
from ..models import KeyValue
from ..public_urls import public_url_for
from . import gateway

MARKER = "[backstop:auto-registered]"
SECRET_KEY = "stripe_webhook_secret"
ENDPOINT_KEY = "stripe_webhook_endpoint_id"


def webhook_secret() -> str | None:
    """The secret the webhook verifies signatures with: STRIPE_WEBHOOK_SECRET wins; otherwise the
    one registration stored (cached for a few seconds so a hot webhook does not read it on every
    delivery)."""
    configured = current_app.config.get("STRIPE_WEBHOOK_SECRET")
    if configured:
        return configured
    # Per app, not per process: an app (and its tests) never sees another app's secret.
    ext = current_app.extensions.setdefault("backstop", {})
    cached = ext.get("webhook_secret")
    if cached and cached[1] > time.monotonic():
        return cached[0]
    row = db.session.get(KeyValue, SECRET_KEY)
    value = row.value if row else None
    db.session.rollback()
    ext["webhook_secret"] = (value, time.monotonic() + (5 if value else 1))
    return value


def forget_webhook_secret() -> None:
    """Registration just stored a new secret: this process reads it on the next delivery."""
    current_app.extensions.setdefault("backstop", {}).pop("webhook_secret", None)


def is_stale_own_endpoint(endpoint: gateway.EndpointView, target_url: str) -> bool:
    if not (endpoint.description or "").startswith(MARKER):
        return False
    return endpoint.url != target_url or endpoint.status != gateway.EndpointStatus.ENABLED


def _store(key: str, value: str) -> None:
    row = db.session.get(KeyValue, key)
    if row is None:
        db.session.add(KeyValue(key=key, value=value))
    else:
        row.value = value
    db.session.commit()


def register_webhook() -> list[str]:
    target = public_url_for("webhooks.stripe_webhook")
    lines = []
    endpoints = gateway.list_webhook_endpoints()
    for ep in endpoints:
        if is_stale_own_endpoint(ep, target):
            gateway.delete_webhook_endpoint(ep.id)
            lines.append(f"deleted stale endpoint {ep.id} ({ep.url}, {ep.status})")
    stored_id = db.session.get(KeyValue, ENDPOINT_KEY)
    stored_secret = db.session.get(KeyValue, SECRET_KEY)
    live = [
        ep
        for ep in endpoints
        if ep.url == target
        and ep.status == gateway.EndpointStatus.ENABLED
        and (ep.description or "").startswith(MARKER)
    ]
    if stored_id and stored_secret and any(ep.id == stored_id.value for ep in live):
        [ours] = [ep for ep in live if ep.id == stored_id.value]
        db.session.rollback()
        missing = [e for e in gateway.EVENT_TYPES if e not in ours.enabled_events and "*" not in ours.enabled_events]
        if missing:
            # Registered by a release that used fewer events (before refunds were followed): the
            # same endpoint and secret, subscribed to what this release needs.
            gateway.subscribe_webhook_endpoint(ours.id)
            lines.append(f"endpoint {ours.id} for {target} now also sends {', '.join(missing)}")
            return lines
        lines.append(f"endpoint {stored_id.value} already registered for {target}")
        return lines
    # Ours but with a secret we no longer know: replace it rather than keep a second secret.
    for ep in live:
        gateway.delete_webhook_endpoint(ep.id)
        lines.append(f"deleted endpoint {ep.id} whose secret this shop does not hold")
    created = gateway.create_webhook_endpoint(
        target, f"{MARKER} Backstop shop at {current_app.config['PUBLIC_BASE_URL']}"
    )
    assert created.secret is not None  # the provider gives an endpoint's secret in its create answer
    _store(SECRET_KEY, created.secret)
    forget_webhook_secret()
    _store(ENDPOINT_KEY, created.id)
    lines.append(f"registered endpoint {created.id} for {target}; signing secret stored for every process")
    return lines
