"""Webhook endpoint self-registration.

The provider reveals a signing secret only when an endpoint is created, so the new secret is
stored at once in the shared store (kv_store) that every process reads. Only endpoints whose
description carries our marker are ever deleted, and only when they point elsewhere or are
disabled: an endpoint a person created is never touched.
"""
from __future__ import annotations

from flask import current_app

from ..extensions import db
from ..models import KeyValue
from . import gateway

MARKER = "[backstop:auto-registered]"
SECRET_KEY = "stripe_webhook_secret"
ENDPOINT_KEY = "stripe_webhook_endpoint_id"


def is_stale_own_endpoint(endpoint: gateway.EndpointView, target_url: str) -> bool:
    if not (endpoint.description or "").startswith(MARKER):
        return False
    return endpoint.url != target_url or endpoint.status != "enabled"


def _store(key: str, value: str) -> None:
    row = db.session.get(KeyValue, key)
    if row is None:
        db.session.add(KeyValue(key=key, value=value))
    else:
        row.value = value
    db.session.commit()


def register_webhook() -> list[str]:
    target = current_app.config["PUBLIC_BASE_URL"] + "/webhooks/stripe"
    lines = []
    endpoints = gateway.list_webhook_endpoints()
    for ep in endpoints:
        if is_stale_own_endpoint(ep, target):
            gateway.delete_webhook_endpoint(ep.id)
            lines.append(f"deleted stale endpoint {ep.id} ({ep.url}, {ep.status})")
    stored_id = db.session.get(KeyValue, ENDPOINT_KEY)
    stored_secret = db.session.get(KeyValue, SECRET_KEY)
    live = [ep for ep in endpoints if ep.url == target and ep.status == "enabled"
            and (ep.description or "").startswith(MARKER)]
    if stored_id and stored_secret and any(ep.id == stored_id.value for ep in live):
        lines.append(f"endpoint {stored_id.value} already registered for {target}")
        db.session.rollback()
        return lines
    # Ours but with a secret we no longer know: replace it rather than keep a second secret.
    for ep in live:
        gateway.delete_webhook_endpoint(ep.id)
        lines.append(f"deleted endpoint {ep.id} whose secret this shop does not hold")
    created = gateway.create_webhook_endpoint(target, f"{MARKER} Backstop shop at {current_app.config['PUBLIC_BASE_URL']}")
    _store(SECRET_KEY, created.secret)
    from ..webhooks import forget_webhook_secret

    forget_webhook_secret()
    _store(ENDPOINT_KEY, created.id)
    lines.append(f"registered endpoint {created.id} for {target}; signing secret stored for every process")
    return lines
