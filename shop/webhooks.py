"""POST /webhooks/stripe: a delivery contract, not an API call.

The status code tells Stripe what to do next, not how our processing went: 400 only when
nothing could be verified (a retry may still fix it), 200 for everything accepted, including
events for orders we do not know and duplicates. Mapping an application problem to a non-2xx
would make Stripe retry and eventually disable the endpoint, silently stopping every payment
update for the whole shop.

Not every rejection is the provider's: the endpoint is public, and scanners post to it without a
signature or with a wrong one. Those are noise, logged at WARNING and kept with the address they
came from (the console's Webhooks card counts them but never turns red for them alone). What is
logged at CRITICAL, and reddens the card, is what means payment updates are being lost: no
signing secret to check with, or a delivery whose signature verified and that still could not be
used. Every receipt keeps its raw body (a rejected one only its beginning) for the console.
Noise is bounded per address and in all (web.webhook_noise); a delivery that verified never is.
"""

from __future__ import annotations

import logging
from typing import cast

from flask import Blueprint, g, jsonify, request
from sqlalchemy import Table, insert

from .domain.deadlines import utcnow
from .extensions import csrf, db
from .models import ReceiptOutcome, WebhookReceipt
from .payments.apply import Outcome, apply_session
from .payments.declines import note_payment_failure
from .payments.holds import hold_ended, hold_lapsed, may_be_held
from .payments.refunds import apply_refund_report
from .provider import gateway
from .provider.guard import Priority, request_priority
from .provider.registration import webhook_secret
from .provider.signature import verify_webhook
from .web import webhook_noise

log = logging.getLogger("shop.webhooks")
bp = Blueprint("webhooks", __name__)
# The provider's webhook sender waits on these requests' provider calls: a customer's priority.
request_priority(bp, Priority.CUSTOMER)

MAX_BODY = 1_000_000
# What a delivery that did not verify keeps of its body: enough to see what it was, not enough
# for anyone on the internet to fill the database through the public endpoint.
NOISE_BODY_CHARS = 2_000


def _text(value, limit: int) -> str | None:
    # A receipt must not fail over what a sender put in a field: PostgreSQL refuses NUL in text,
    # and no database driver can encode a lone surrogate (valid JSON: "\ud800"), so that one is
    # kept as its escape.
    if not value:
        return None
    return str(value).replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def _write_receipt(
    outcome: ReceiptOutcome, reason: str, status: int, event_id=None, event_type=None, order_id=None
) -> None:
    """One Core INSERT into the caller's transaction (no ORM object: the webhook is hot). The
    body, the address and whether the signature verified are this request's (`g`)."""
    if not isinstance(order_id, int) or not -(2**31) <= order_id < 2**31:
        order_id = None  # metadata.order_id is the sender's text; the column is a 32-bit integer
    signed = g.get("webhook_signed")
    body = g.get("webhook_body")
    if body is not None:
        body = _text(body.decode("utf-8", "replace"), MAX_BODY if signed else NOISE_BODY_CHARS)
    db.session.execute(
        _INSERT_RECEIPT,
        {
            "event_id": _text(event_id, 255),
            "event_type": _text(event_type, 100),
            "outcome": outcome,
            "reason": _text(reason, 2000) or "",
            "order_id": order_id,
            "http_status": status,
            "received_at": utcnow(),
            # The client's address as the trusted proxies name it (web.proxies), never a
            # header the client chose.
            "source_address": _text(request.remote_addr, 64),
            "body": body,
            "signed": signed,
        },
    )


# Built once: building the statement on every delivery cost about as much CPU as running it.
_INSERT_RECEIPT = insert(cast(Table, WebhookReceipt.__table__))  # a mapped class's table is a Table


def _record(outcome: ReceiptOutcome, reason: str, status: int, event_id=None, event_type=None, order_id=None) -> None:
    """The receipt in a transaction of its own: for deliveries that change nothing else
    (rejected, ignored) and for one whose own transaction could not commit."""
    try:
        _write_receipt(outcome, reason, status, event_id, event_type, order_id)
        db.session.commit()
    except Exception:  # recording must never turn an accepted delivery into a retry storm
        db.session.rollback()
        log.exception("could not record webhook receipt (%s %s)", outcome, event_id)


def _reject(reason: str, status: int = 400, *, lost: bool = False):
    """Refuse a delivery. `lost`: the refusal means the provider's own updates are being lost (no
    secret to check with, or a verified delivery the shop cannot use): CRITICAL. Anything else
    did not verify and may be anyone's: a WARNING naming the address it came from."""
    if lost:
        log.critical(
            "Stripe webhook REJECTED (%s): every payment update is being lost until this is fixed "
            "(check STRIPE_WEBHOOK_SECRET / the registered endpoint).",
            reason,
        )
        _record(ReceiptOutcome.REJECTED, reason, status)
        return jsonify({"error": reason}), status
    if not webhook_noise.may_record(request.remote_addr):
        return _throttled()
    log.warning(
        "webhook delivery from %s refused (%s): not signed with this shop's secret; noise unless it is the "
        "provider's (then STRIPE_WEBHOOK_SECRET is wrong)",
        request.remote_addr,
        reason,
    )
    _record(ReceiptOutcome.REJECTED, reason, status)
    webhook_noise.after_written()
    return jsonify({"error": reason}), status


def _throttled():
    """Noise past its address's limit (web.webhook_noise): answered, not written anywhere."""
    return jsonify({"error": THROTTLED}), 429


THROTTLED = (
    "too many deliveries that are not signed with this shop's secret from your address; "
    "they are not recorded for the rest of this minute"
)


def _read_body() -> bytes | None:
    """At most MAX_BODY bytes, before anything is verified; None when the body is larger.

    Read until the end: one read() of a chunked body (no Content-Length) may return a single
    chunk, which would cut a large body short and check the signature of a fragment."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        return None
    # The app-wide MAX_CONTENT_LENGTH caps a chunked body's stream at exactly MAX_BODY, so a body
    # of MAX_BODY + 1000 bytes would read as MAX_BODY and pass for complete: allow one byte more
    # here, which is how a body over the limit shows itself.
    request.max_content_length = MAX_BODY + 1
    stream, parts, size = request.stream, [], 0
    while size <= MAX_BODY:
        part = stream.read(MAX_BODY + 1 - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return None if size > MAX_BODY else b"".join(parts)


@bp.post("/webhooks/stripe")
@csrf.exempt
def stripe_webhook():
    """Receive one signed Stripe event."""
    try:
        body = _read_body()
    except Exception:  # werkzeug's own limit (MAX_CONTENT_LENGTH) on a chunked body
        body = None
    if body is None:
        # Not verified (too big to read): noise unless it is the provider's, which never sends one.
        g.webhook_signed = False
        if not webhook_noise.may_record(request.remote_addr):
            return _throttled()
        log.warning(
            "webhook delivery from %s refused: body over %d bytes; if this is Stripe, that event is being lost",
            request.remote_addr,
            MAX_BODY,
        )
        _record(ReceiptOutcome.REJECTED, f"body over {MAX_BODY} bytes", 413)
        webhook_noise.after_written()
        return jsonify({"error": "payload too large"}), 413
    g.webhook_body = body
    secret = webhook_secret()
    if not secret:
        return _reject("no signing secret configured", lost=True)  # nothing can verify: `signed` unknown
    g.webhook_signed = False
    if not body.strip():
        return _reject("empty body")
    signature = request.headers.get("Stripe-Signature")
    if not signature:
        return _reject("no Stripe-Signature header")
    try:
        event = verify_webhook(body, signature, secret)
    except gateway.SignatureProblem as exc:
        return _reject(f"bad signature or stale timestamp: {exc}")
    except UnicodeDecodeError:  # not text: refused before its signature could be checked
        return _reject("unparseable body")
    except ValueError:
        g.webhook_signed = True  # the signature verified: the body is the provider's (or the secret's holder's)
        return _reject("unparseable body", lost=True)
    g.webhook_signed = True
    if (
        not isinstance(event, dict)
        or not isinstance(event.get("data"), dict)
        or not isinstance(event["data"].get("object"), dict)
        or not isinstance(event.get("type"), str)
        or not _usable_id(event.get("id"))
    ):
        return _reject("unparseable body: not a Stripe event", lost=True)
    return _accept(event)


def _usable_id(value) -> bool:
    """An event id the shop can store and compare: absent, or text without control characters
    (a NUL cannot be stored by PostgreSQL) that fits the receipts' column. Stripe's are `evt_`
    and letters and digits; a signed body with anything else is not Stripe's."""
    return value is None or (
        isinstance(value, str) and 0 < len(value) <= 255 and not any(ord(c) < 32 or ord(c) == 127 for c in value)
    )


HANDLED = set(gateway.EVENT_TYPES)


def _accept(event: dict):
    event_id, event_type = event.get("id"), event.get("type")
    if event_type not in HANDLED:
        _record(ReceiptOutcome.IGNORED, f"event type {event_type} is not used", 200, event_id, event_type)
        return jsonify({"received": True, "outcome": "ignored"}), 200
    if event_type in gateway.REFUND_EVENT_TYPES:
        return _accept_refund(event, event_id, event_type)
    if event_type in gateway.PAYMENT_FAILURE_EVENT_TYPES:
        return _accept_payment_failure(event, event_id, event_type)
    if event_type in gateway.HOLD_END_EVENT_TYPES:  # a held payment voided or lapsed
        view = gateway.payment_view(event["data"]["object"])
        return _applied_with_receipt(
            lambda receipt: hold_ended(view, before_commit=receipt), event_id, event_type, view.order_id
        )
    if event_type in gateway.HOLD_LAPSE_EVENT_TYPES:  # a held payment's charge lapsed
        return _accept_hold_lapse(event["data"]["object"], event_id, event_type)
    view = gateway.session_view(event["data"]["object"])
    if view.id is None or not _usable_id(view.id):
        # Every Checkout Session event names its session; without one there is nothing to
        # apply or to ask the provider about (and the SDK would refuse the call).
        _record(ReceiptOutcome.IGNORED, "the event names no checkout session", 200, event_id, event_type)
        return jsonify({"received": True, "outcome": "ignored"}), 200
    failed = event_type == "checkout.session.async_payment_failed"
    by_cancel = event_type == "checkout.session.expired" and gateway.expired_by_a_cancel(event)

    def receipt(result) -> tuple:
        outcome = ReceiptOutcome.DUPLICATE if result.outcome == Outcome.DUPLICATE else ReceiptOutcome.ACCEPTED
        return (
            outcome,
            result.outcome + (f": {result.detail}" if result.detail else ""),
            200,
            event_id,
            event_type,
            result.order.id if result.order is not None else view.order_id,
        )

    try:
        if event_type == "checkout.session.expired" or may_be_held(view):
            view = _trust_provider_now(view)
        # The receipt rides in the transaction that dedups and applies the event: one commit.
        result = apply_session(
            view,
            source="webhook",
            failed=failed,
            event_id=event_id,
            expired_by_cancel=by_cancel,
            before_commit=lambda applied: _write_receipt(*receipt(applied)),
        )
    except Exception as exc:
        log.warning(
            "webhook event %s (%s) could not be applied together with its receipt (%s); trying once more without it",
            event_id,
            event_type,
            exc,
        )
        return _apply_then_record(event_id, event_type, view, failed, receipt, by_cancel)
    _log_unknown(result, event_id, event_type, view)
    return jsonify({"received": True, "outcome": result.outcome}), 200


def _accept_refund(event: dict, event_id, event_type):
    """A refund's news (`refund.updated`, `refund.failed`): applied with its receipt in one
    transaction. Repeats and stale reports change nothing (payments.refunds); one that cannot be
    applied now is answered 200 all the same and recorded `failed`: the sweep's watch asks the
    provider about a pending refund of a cancelled order itself."""
    view = gateway.refund_view(event["data"]["object"])
    if view.id is None or not _usable_id(view.id):
        _record(ReceiptOutcome.IGNORED, "the event names no refund", 200, event_id, event_type)
        return jsonify({"received": True, "outcome": "ignored"}), 200

    return _applied_with_receipt(
        lambda receipt: apply_refund_report(view, source="webhook", before_commit=receipt),
        event_id,
        event_type,
        view.order_id,
    )


def _accept_hold_lapse(charge: dict, event_id, event_type):
    """`charge.expired`: the charge names its payment, whose metadata names the order; the payment
    is read from the provider and the order ended as for `payment_intent.canceled`. Unanswered, it
    is recorded `failed`: that notice, or the hold's own deadline, ends the order instead."""
    intent, charge_id = charge.get("payment_intent"), charge.get("id")
    if not isinstance(intent, str) or not intent or not _usable_id(intent):
        _record(ReceiptOutcome.IGNORED, "the charge names no payment", 200, event_id, event_type)
        return jsonify({"received": True, "outcome": "ignored"}), 200
    return _applied_with_receipt(
        lambda receipt: hold_lapsed(intent, str(charge_id or ""), before_commit=receipt), event_id, event_type, None
    )


def _accept_payment_failure(event: dict, event_id, event_type):
    """A card declined on the payment page: noted on the order with its receipt, in one
    transaction. One that cannot be noted now is answered 200 all the same and recorded `failed`:
    it changes no state (the session stays open, and the customer saw the refusal there)."""
    view = gateway.payment_failure_view(event["data"]["object"])

    return _applied_with_receipt(
        lambda receipt: note_payment_failure(view, before_commit=receipt), event_id, event_type, view.order_id
    )


def _applied_with_receipt(apply, event_id, event_type, order_id):
    """Run `apply(receipt)`, whose transaction writes the delivery's `accepted` receipt (what it did,
    and to which order) just before it commits; one that raises is answered 200 all the same and
    recorded `failed` in its own transaction (the provider is not asked to retry what the shop
    will settle itself)."""

    def receipt(done) -> None:
        detail = f": {done.detail}" if done.detail else ""
        _write_receipt(ReceiptOutcome.ACCEPTED, done.outcome + detail, 200, event_id, event_type, done.order_id)

    try:
        done = apply(receipt)
    except Exception as exc:
        db.session.rollback()
        log.warning("webhook event %s (%s) accepted but not applied: %s", event_id, event_type, exc, exc_info=True)
        _record(ReceiptOutcome.FAILED, f"accepted, not applied: {_in_words(exc)}", 200, event_id, event_type, order_id)
        return jsonify({"received": True, "outcome": "failed"}), 200
    return jsonify({"received": True, "outcome": done.outcome}), 200


def _apply_then_record(event_id, event_type, view, failed, receipt, by_cancel):
    """The fallback when the one-commit path failed: apply alone (so nothing about the receipt
    can hold back a payment), then record the delivery in its own transaction either way."""
    try:
        result = apply_session(view, source="webhook", failed=failed, event_id=event_id, expired_by_cancel=by_cancel)
    except Exception as exc:
        # Accepted but not applied: 200 so Stripe does not disable us; the sweep and the
        # return page will apply it, and the receipt + log make it visible.
        db.session.rollback()
        log.warning("webhook event %s (%s) accepted but not applied: %s", event_id, event_type, exc, exc_info=True)
        _record(
            ReceiptOutcome.FAILED, f"accepted, not applied: {_in_words(exc)}", 200, event_id, event_type, view.order_id
        )
        return jsonify({"received": True, "outcome": "failed"}), 200
    _log_unknown(result, event_id, event_type, view)
    _record(*receipt(result))
    return jsonify({"received": True, "outcome": result.outcome}), 200


def _in_words(exc: Exception) -> str:
    """What went wrong, for the console: the driver's first line, never the SQL statement and its
    parameters that SQLAlchemy's own message carries (the log has the whole traceback)."""
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first}"[:300]


def _log_unknown(result, event_id, event_type, view) -> None:
    if result.outcome == Outcome.UNKNOWN_ORDER:
        log.warning("webhook event %s (%s) for an unknown order (session %s)", event_id, event_type, view.id)


def _trust_provider_now(view):
    """An 'expired' notice may be stale or out of order: what the provider says now wins."""
    try:
        return gateway.retrieve_session(view.id)
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        log.info("could not re-read session %s (%s); using the event's copy", view.id, exc)
        return view


def init_app(app) -> None:
    app.register_blueprint(bp)
