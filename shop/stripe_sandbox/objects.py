"""The sandbox's records and their Stripe JSON renderings.

Records hold what the sandbox knows; `render_*` turn them into the JSON Stripe would send.
Every top-level field rendered here exists in Stripe's own example object for the resource
(shared/stripe-fixtures/fixtures3-subset.json) with the same JSON type or null, except
`secret`, which Stripe returns on webhook-endpoint creation only and the fixture omits, and a
refund's `failure_reason`, which Stripe sends only on a failed refund (the example succeeded).
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "2026-10-28.endive"

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


@dataclass
class LineItem:
    name: str
    currency: str
    unit_amount: int
    quantity: int

    @property
    def amount(self) -> int:
        return self.unit_amount * self.quantity


@dataclass
class Session:
    id: str
    seq: int
    created: int
    expires_at: int
    currency: str
    line_items: list[LineItem]
    pay_url: str
    success_url: str | None
    cancel_url: str | None
    client_reference_id: str | None
    customer_email: str | None
    metadata: dict[str, str]
    payment_intent_metadata: dict[str, str]
    locale: str | None = None
    # Created while the `checkout_url_null` fault was on: rendered with `url: null`, as Stripe
    # renders a session that cannot be opened by a URL.
    url_withheld: bool = False
    status: str = "open"  # open | complete | expired
    payment_status: str = "unpaid"  # unpaid | paid
    payment_intent_id: str | None = None
    customer_details: dict | None = None
    # `shipping_address_collection[allowed_countries]`: the hosted page asks for an address in
    # one of these; None when the session was created without it (nothing is asked).
    shipping_countries: list[str] | None = None
    # What the customer gave, as Stripe renders it under `collected_information.shipping_details`:
    # {"name", "address": {"city", "country", "line1", "line2", "postal_code", "state"}}.
    shipping_details: dict | None = None
    # Automatic tax (the `automatic_tax[enabled]` param, else the account's default): while on,
    # `tax_status` is requires_location_inputs until the customer's address is known, then
    # complete with `amount_tax` (exclusive, from the account's tax rates) added to the total.
    automatic_tax: bool = False
    tax_status: str | None = None
    amount_tax: int = 0
    # Adaptive Pricing: `presentment` is {"presentment_amount", "presentment_currency"} once a
    # customer whose country has another currency is known; the session's currency stays ours.
    adaptive_pricing: bool = False
    presentment: dict | None = None
    payment_method_types: list[str] = field(default_factory=lambda: ["card"])
    # {"oxxo": {"expires_after_days": 3}, ...}: one entry per voucher type the session offers.
    payment_method_options: dict = field(default_factory=dict)
    # The customer's (billing) address in Stripe's shape, once given.
    customer_address: dict | None = None
    # `payment_intent_data[capture_method]`: manual holds every payment for a later capture.
    capture_method: str = "automatic"

    @property
    def collects_shipping(self) -> bool:
        return bool(self.shipping_countries)

    @property
    def amount_subtotal(self) -> int:
        return sum(line.amount for line in self.line_items)

    @property
    def amount_total(self) -> int:
        return self.amount_subtotal + self.amount_tax


@dataclass
class PaymentIntent:
    id: str
    seq: int
    created: int
    amount: int
    currency: str
    metadata: dict[str, str]
    session_id: str
    status: str = "requires_payment_method"
    amount_received: int = 0
    latest_charge: str | None = None
    payment_method: str | None = None
    last_payment_error: dict | None = None
    canceled_at: int | None = None
    cancellation_reason: str | None = None
    client_secret: str = ""
    payment_method_types: list[str] = field(default_factory=lambda: ["card"])
    # `capture_method` for every method, and the card's own (`payment_method_options[card]`)
    # when the session asked for it per method; `amount_capturable` while a hold awaits capture.
    capture_method: str = "automatic"
    card_capture_method: str | None = None
    amount_capturable: int = 0

    @property
    def card_captures_manually(self) -> bool:
        return (self.card_capture_method or self.capture_method) == "manual"


@dataclass
class Charge:
    id: str
    payment_intent_id: str
    amount: int
    currency: str
    created: int
    status: str  # pending | succeeded | failed
    amount_refunded: int = 0
    # An authorization held for a later capture is `succeeded` but not `captured` until then;
    # `capture_before` is when the hold lapses. `amount_captured` None means all of `amount`.
    captured: bool = True
    amount_captured: int | None = None
    capture_before: int | None = None


@dataclass
class Refund:
    id: str
    seq: int
    created: int
    amount: int
    currency: str
    charge_id: str
    payment_intent_id: str
    metadata: dict[str, str]
    reason: str | None
    # pending (the `refunds_pending` fault) until settled by /_sandbox/refunds/<id>/outcome;
    # succeeded | failed then. A failed refund says why, as Stripe's do.
    status: str = "succeeded"
    failure_reason: str | None = None


@dataclass
class WebhookEndpoint:
    id: str
    seq: int
    created: int
    url: str
    enabled_events: list[str]
    secret: str
    description: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    api_version: str | None = None
    status: str = "enabled"  # enabled | disabled

    def wants(self, event_type: str) -> bool:
        return self.status == "enabled" and ("*" in self.enabled_events or event_type in self.enabled_events)


@dataclass
class Attempt:
    at: float  # wall-clock unix time of the attempt
    status_code: int | None
    error: str | None
    duration_ms: int


@dataclass
class Delivery:
    id: str
    event_id: str
    endpoint_id: str
    url: str
    duplicate: bool = False
    # pending: queued or retrying; held: waiting for reorder release; succeeded: got a 2xx;
    # dropped: the drop_webhooks fault swallowed it; abandoned: endpoint deleted/disabled,
    # sandbox reset, or the retry window ran out.
    status: str = "pending"
    attempts: list[Attempt] = field(default_factory=list)
    next_attempt_at: float | None = None  # wall-clock
    abandoned_reason: str | None = None


@dataclass
class EventRecord:
    id: str
    seq: int
    type: str
    created: int
    payload: dict[str, Any]
    body: bytes  # the exact JSON bytes delivered (and signed) for this event
    session_id: str | None
    deliveries: list[Delivery] = field(default_factory=list)
    dropped: bool = False

    @property
    def pending_webhooks(self) -> int:
        return sum(1 for d in self.deliveries if d.status in ("pending", "held") and not d.duplicate)


# ---------------------------------------------------------------------------------------
# Renderings


def render_session(s: Session) -> dict[str, Any]:
    body = {
        "id": s.id,
        "object": "checkout.session",
        "adaptive_pricing": {"enabled": s.adaptive_pricing},
        "after_expiration": None,
        "allow_promotion_codes": None,
        "amount_subtotal": s.amount_subtotal,
        "amount_total": s.amount_total,
        "automatic_tax": (
            {"enabled": True, "liability": {"type": "self"}, "provider": "stripe", "status": s.tax_status}
            if s.automatic_tax
            else {"enabled": False, "liability": None, "provider": None, "status": None}
        ),
        "billing_address_collection": None,
        "cancel_url": s.cancel_url,
        "client_reference_id": s.client_reference_id,
        "client_secret": None,
        "collected_information": (
            {"business_name": None, "individual_name": None, "shipping_details": _copy(s.shipping_details)}
            if s.shipping_details
            else None
        ),
        "consent": None,
        "consent_collection": None,
        "created": s.created,
        "currency": s.currency,
        "custom_fields": [],
        "custom_text": {
            "after_submit": None,
            "shipping_address": None,
            "submit": None,
            "terms_of_service_acceptance": None,
        },
        "customer": None,
        "customer_creation": None,
        "customer_details": _customer_details(s),
        "customer_email": s.customer_email,
        "discounts": None,
        "expires_at": s.expires_at,
        "invoice": None,
        "invoice_creation": None,
        "livemode": False,
        "locale": s.locale,
        "metadata": dict(s.metadata),
        "mode": "payment",
        "payment_intent": s.payment_intent_id,
        "payment_link": None,
        "payment_method_collection": None,
        "payment_method_configuration_details": None,
        "payment_method_options": {kind: dict(options) for kind, options in s.payment_method_options.items()},
        "payment_method_types": list(s.payment_method_types),
        "payment_status": s.payment_status,
        "phone_number_collection": {"enabled": False},
        "recovered_from": None,
        "saved_payment_method_options": None,
        "setup_intent": None,
        "shipping_address_collection": (
            {"allowed_countries": list(s.shipping_countries)} if s.shipping_countries else None
        ),
        "shipping_cost": None,
        "shipping_options": [],
        "status": s.status,
        "submit_type": None,
        "subscription": None,
        "success_url": s.success_url,
        "total_details": {"amount_discount": 0, "amount_shipping": 0, "amount_tax": s.amount_tax},
        "ui_mode": None,
        # Stripe only shows the URL while the session can still be paid.
        "url": s.pay_url if s.status == "open" and not s.url_withheld else None,
    }
    # Stripe adds it only when Adaptive Pricing showed the customer another currency.
    if s.presentment is not None:
        body["presentment_details"] = dict(s.presentment)
    return body


def _customer_details(s: Session) -> dict | None:
    if not s.customer_details:
        return None
    return {**s.customer_details, "address": dict(s.customer_address) if s.customer_address else None}


def _copy(details: dict) -> dict:
    return {"address": dict(details.get("address") or {}), "name": details.get("name")}


def render_payment_intent(pi: PaymentIntent) -> dict[str, Any]:
    return {
        "id": pi.id,
        "object": "payment_intent",
        "amount": pi.amount,
        "amount_capturable": pi.amount_capturable,
        "amount_details": {"tip": {}},
        "amount_received": pi.amount_received,
        "application": None,
        "application_fee_amount": None,
        "automatic_payment_methods": None,
        "canceled_at": pi.canceled_at,
        "cancellation_reason": pi.cancellation_reason,
        "capture_method": pi.capture_method,
        "client_secret": pi.client_secret,
        "confirmation_method": "automatic",
        "created": pi.created,
        "currency": pi.currency,
        "customer": None,
        "description": None,
        "last_payment_error": dict(pi.last_payment_error) if pi.last_payment_error else None,
        "latest_charge": pi.latest_charge,
        "livemode": False,
        "metadata": dict(pi.metadata),
        "next_action": None,
        "on_behalf_of": None,
        "payment_method": pi.payment_method,
        "payment_method_configuration_details": None,
        "payment_method_options": (
            {"card": {"capture_method": pi.card_capture_method}} if pi.card_capture_method else {}
        ),
        "payment_method_types": list(pi.payment_method_types),
        "processing": None,
        "receipt_email": None,
        "review": None,
        "setup_future_usage": None,
        "shipping": None,
        "source": None,
        "statement_descriptor": None,
        "statement_descriptor_suffix": None,
        "status": pi.status,
        "transfer_data": None,
        "transfer_group": None,
    }


def render_charge(c: Charge) -> dict[str, Any]:
    """A Charge as `payment_intent.latest_charge` expands to (the fields a shop reads: how much of
    it was refunded), in Stripe's shape."""
    succeeded = c.status == "succeeded"
    captured = succeeded and c.captured
    return {
        "id": c.id,
        "object": "charge",
        "amount": c.amount,
        "amount_captured": (c.amount if c.amount_captured is None else c.amount_captured) if captured else 0,
        "amount_refunded": c.amount_refunded,
        "captured": captured,
        "created": c.created,
        "currency": c.currency,
        "description": None,
        "disputed": False,
        "failure_code": None if c.status != "failed" else "card_declined",
        "failure_message": None if c.status != "failed" else "Your card was declined.",
        "livemode": False,
        "metadata": {},
        "paid": succeeded,
        "payment_intent": c.payment_intent_id,
        "payment_method_details": {
            "card": {"brand": "visa", "capture_before": c.capture_before, "last4": "4242", "network": "visa"},
            "type": "card",
        },
        "receipt_email": None,
        "refunded": succeeded and c.amount_refunded >= c.amount,
        "status": c.status,
    }


def render_refund(r: Refund) -> dict[str, Any]:
    body = {
        "id": r.id,
        "object": "refund",
        "amount": r.amount,
        "balance_transaction": None,
        "charge": r.charge_id,
        "created": r.created,
        "currency": r.currency,
        "destination_details": {"card": {"type": "refund"}, "type": "card"},
        "metadata": dict(r.metadata),
        "payment_intent": r.payment_intent_id,
        "reason": r.reason,
        "receipt_number": None,
        "source_transfer_reversal": None,
        "status": r.status,
        "transfer_reversal": None,
    }
    if r.status == "failed":
        body["failure_reason"] = r.failure_reason
    return body


def render_webhook_endpoint(we: WebhookEndpoint, *, with_secret: bool = False) -> dict[str, Any]:
    body = {
        "id": we.id,
        "object": "webhook_endpoint",
        "api_version": we.api_version,
        "application": None,
        "created": we.created,
        "description": we.description,
        "enabled_events": list(we.enabled_events),
        "livemode": False,
        "metadata": dict(we.metadata),
        "status": we.status,
        "url": we.url,
    }
    if with_secret:
        body["secret"] = we.secret
    return body


def render_event(ev: EventRecord) -> dict[str, Any]:
    """The event as the API shows it now (pending_webhooks is live, the snapshot is not)."""
    return {**ev.payload, "pending_webhooks": ev.pending_webhooks}


def render_delivery(d: Delivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "endpoint": d.endpoint_id,
        "url": d.url,
        "status": d.status,
        "duplicate": d.duplicate,
        "abandoned_reason": d.abandoned_reason,
        "next_attempt_at": d.next_attempt_at,
        "attempts": [
            {
                "at": a.at,
                "status_code": a.status_code,
                "error": a.error,
                "duration_ms": a.duration_ms,
            }
            for a in d.attempts
        ],
    }
