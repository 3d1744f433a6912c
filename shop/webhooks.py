"""POST /webhooks/stripe: a delivery contract, not an API call.

The status code tells Stripe what to do next, not how our processing went: 400 only when
nothing could be verified (a retry may still fix it), 200 for everything accepted, including
events for orders we do not know and duplicates. Mapping an application problem to a non-2xx
would make Stripe retry and eventually disable the endpoint, silently stopping every payment
update for the whole shop. Rejections are logged at CRITICAL for the same reason.
"""
from __future__ import annotations

import logging
import time

from flask import Blueprint, current_app, jsonify, request

from .extensions import csrf, db
from .models import KeyValue, WebhookReceipt
from .payments import gateway
from .payments.service import apply_session

log = logging.getLogger("shop.webhooks")
bp = Blueprint("webhooks", __name__)

MAX_BODY = 1_000_000
SECRET_KEY_NAME = "stripe_webhook_secret"  # written by payments.registration
_secret_cache: dict = {}


def webhook_secret() -> str | None:
    """STRIPE_WEBHOOK_SECRET wins; otherwise the store written by webhook registration (cached
    for a few seconds so a hot webhook does not read it on every delivery)."""
    configured = current_app.config.get("STRIPE_WEBHOOK_SECRET")
    if configured:
        return configured
    key = (current_app.config["SQLALCHEMY_DATABASE_URI"], SECRET_KEY_NAME)
    cached = _secret_cache.get(key)
    if cached and cached[1] > time.monotonic():
        return cached[0]
    row = db.session.get(KeyValue, SECRET_KEY_NAME)
    value = row.value if row else None
    db.session.rollback()
    _secret_cache[key] = (value, time.monotonic() + (5 if value else 1))
    return value


def _record(outcome: str, reason: str, status: int, event_id=None, event_type=None, order_id=None) -> None:
    try:
        db.session.add(WebhookReceipt(event_id=(event_id or None) and str(event_id)[:255],
                                      event_type=(event_type or None) and str(event_type)[:100],
                                      outcome=outcome, reason=reason[:2000], order_id=order_id, http_status=status))
        db.session.commit()
    except Exception:  # recording must never turn an accepted delivery into a retry storm
        db.session.rollback()
        log.exception("could not record webhook receipt (%s %s)", outcome, event_id)


def _reject(reason: str, status: int = 400):
    log.critical("Stripe webhook REJECTED (%s): every payment update is being lost until this is fixed "
                 "(check STRIPE_WEBHOOK_SECRET / the registered endpoint).", reason)
    _record("rejected", reason, status)
    return jsonify({"error": reason}), status


def _read_body() -> bytes | None:
    """At most MAX_BODY bytes, before anything is verified; None when the body is larger."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        return None
    body = request.stream.read(MAX_BODY + 1)
    return None if len(body) > MAX_BODY else body


@bp.post("/webhooks/stripe")
@csrf.exempt
def stripe_webhook():
    """Receive one signed Stripe event."""
    try:
        body = _read_body()
    except Exception:  # werkzeug's own limit (MAX_CONTENT_LENGTH) on a chunked body
        body = None
    if body is None:
        log.critical("Stripe webhook REJECTED: body over %d bytes; if this is Stripe, that event is being lost",
                     MAX_BODY)
        _record("rejected", f"body over {MAX_BODY} bytes", 413)
        return jsonify({"error": "payload too large"}), 413
    secret = webhook_secret()
    if not secret:
        return _reject("no signing secret configured")
    if not body.strip():
        return _reject("empty body")
    signature = request.headers.get("Stripe-Signature")
    if not signature:
        return _reject("no Stripe-Signature header")
    try:
        event = gateway.verify_webhook(body, signature, secret)
    except gateway.SignatureProblem as exc:
        return _reject(f"bad signature or stale timestamp: {exc}")
    except (ValueError, UnicodeDecodeError):
        return _reject("unparseable body")
    if not isinstance(event, dict) or not isinstance(event.get("data"), dict) or \
            not isinstance(event["data"].get("object"), dict):
        return _reject("unparseable body: not a Stripe event")
    return _accept(event)


HANDLED = set(gateway.EVENT_TYPES)


def _accept(event: dict):
    event_id, event_type = event.get("id"), event.get("type")
    if event_type not in HANDLED:
        _record("ignored", f"event type {event_type} is not used", 200, event_id, event_type)
        return jsonify({"received": True, "outcome": "ignored"}), 200
    view = gateway.session_view(event["data"]["object"])
    failed = event_type == "checkout.session.async_payment_failed"
    try:
        if event_type == "checkout.session.expired":
            view = _trust_provider_now(view)
        result = apply_session(view, source="webhook", failed=failed, event_id=event_id)
    except Exception as exc:
        # Accepted but not applied: 200 so Stripe does not disable us; the sweep and the
        # return page will apply it, and the receipt + log make it visible.
        db.session.rollback()
        log.warning("webhook event %s (%s) accepted but not applied: %s", event_id, event_type, exc, exc_info=True)
        _record("failed", f"accepted, not applied: {exc}", 200, event_id, event_type, view.order_id)
        return jsonify({"received": True, "outcome": "failed"}), 200
    outcome = "duplicate" if result.outcome == "duplicate" else "accepted"
    if result.outcome == "unknown_order":
        log.warning("webhook event %s (%s) for an unknown order (session %s)", event_id, event_type, view.id)
    _record(outcome, result.outcome + (f": {result.detail}" if result.detail else ""), 200, event_id, event_type,
            result.order.id if result.order is not None else view.order_id)
    return jsonify({"received": True, "outcome": result.outcome}), 200


def _trust_provider_now(view):
    """An 'expired' notice may be stale or out of order: what the provider says now wins."""
    try:
        return gateway.retrieve_session(view.id)
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        log.info("could not re-read session %s (%s); using the event's copy", view.id, exc)
        return view


def init_app(app) -> None:
    app.register_blueprint(bp)
