"""A webhook delivery's signature, verified on its raw body (docs/REFERENCE.md, Webhook), and the
event read from it as a plain dict. Like gateway.py, it uses Stripe's SDK (its signature check)."""

from __future__ import annotations

import json

import stripe

from .errors import SignatureProblem


def verify_webhook(payload: bytes, signature: str | None, secret: str) -> dict:
    """Verify the signature on the raw body and return the event as a plain dict.

    The SDK's own check (`verify_header`: HMAC, scheme, timestamp tolerance), then one parse.
    `construct_event` runs that same check but also parses the body a second time and builds a
    stripe Event object that nothing here uses; on a hot webhook that was most of the cost of
    verifying. Raises SignatureProblem, or ValueError (UnicodeDecodeError included) for a body
    that is not a JSON object."""
    text = payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else payload
    try:
        stripe.WebhookSignature.verify_header(text, signature, secret, stripe.Webhook.DEFAULT_TOLERANCE)
    except stripe.SignatureVerificationError as exc:
        raise SignatureProblem(str(exc)) from exc
    try:
        event = json.loads(text)
    except RecursionError as exc:  # signed, but nested deeper than the parser goes
        raise ValueError("nested too deeply") from exc
    # construct_event refuses these too: signed JSON that is not an object (`[1, 2]`), and a
    # thin v2 notification sent to an endpoint that expects snapshot events.
    if not isinstance(event, dict):
        raise ValueError("not a JSON object")
    if event.get("object") == "v2.core.event":
        raise ValueError("a thin event notification, not a snapshot event")
    return event
