"""The provider's objects as plain values: a Checkout Session (`SessionView`), a refund
(`RefundView`), a session's event (`SessionEvent`) and a webhook endpoint (`EndpointView`), read
from a stripe object or from an event's JSON, so no stripe object (which in stripe 16 is not a
dict) leaks into the shop; and the event types the shop listens to."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

# The provider's own vocabularies, as it documents them (read as sent: a value outside them is
# passed on as it is, and an absent or malformed one reads as None).
SessionStatus = Literal["open", "complete", "expired"]
SessionPaymentStatus = Literal["paid", "unpaid", "no_payment_required"]
RefundStatus = Literal["pending", "requires_action", "succeeded", "failed", "canceled"]

EVENT_TYPES = [
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
    "refund.updated",
    "refund.failed",
]
# A refund's news (docs/REFERENCE.md, Webhook): its object is the refund, not a session.
REFUND_EVENT_TYPES = ("refund.updated", "refund.failed")


@dataclass(frozen=True)
class SessionView:
    id: str
    status: SessionStatus | None
    payment_status: SessionPaymentStatus | None
    amount_total: int | None
    currency: str | None
    url: str | None
    payment_intent: str | None
    expires_at: datetime | None
    order_id: int | None  # from metadata.order_id
    client_reference_id: str | None
    shop_mark: str | None = None  # from metadata.shop: which shop made the session (shop.payments.mark)


@dataclass(frozen=True)
class RefundView:
    id: str | None
    status: RefundStatus | None  # nullable at the provider
    amount: int | None
    payment_intent: str | None  # nullable at Stripe
    failure_reason: str | None  # only on a failed refund
    order_id: int | None  # from metadata: the shop's own (order, session, attempt)
    session_id: str | None
    attempt: int | None
    refund_id: int | None = None  # from metadata: an operator's refund names the shop's row


def refund_view(obj) -> RefundView:
    """Accepts a stripe object or a plain dict (an event's data.object), read as defensively as
    `session_view`: a field of the wrong type reads as absent."""
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        obj = {}
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}

    def text(value):
        return value if isinstance(value, str) else None

    def number(value):
        value = int(value) if isinstance(value, str) and value.isdigit() and len(value) < 10 else value
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None

    intent = obj.get("payment_intent")
    return RefundView(
        id=text(obj.get("id")),
        status=text(obj.get("status")),
        amount=number(obj.get("amount")),
        payment_intent=text(intent.get("id") if isinstance(intent, dict) else intent),
        failure_reason=text(obj.get("failure_reason")),
        order_id=number(metadata.get("order_id")),
        session_id=text(metadata.get("session_id")),
        attempt=number(metadata.get("attempt")) or 1,
        refund_id=number(metadata.get("refund_id")) or None,
    )


def session_view(obj) -> SessionView:
    """Accepts a stripe object or a plain dict (an event's data.object).

    An event's object is the sender's JSON, checked only for its signature: a field of the wrong
    type reads as absent here (the order is then not found, or the proof check refuses it), so
    a malformed notice is answered, never a crash."""
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        obj = {}
    metadata = obj.get("metadata")
    raw_order = metadata.get("order_id") if isinstance(metadata, dict) else None
    order_id = (
        int(raw_order)
        if isinstance(raw_order, str) and raw_order.isdigit() and len(raw_order) < 12
        else raw_order
        if isinstance(raw_order, int) and not isinstance(raw_order, bool)
        else None
    )
    intent = obj.get("payment_intent")
    if isinstance(intent, dict):
        intent = intent.get("id")
    expires = obj.get("expires_at")
    amount = obj.get("amount_total")

    def text(value):
        return value if isinstance(value, str) else None

    return SessionView(
        id=text(obj.get("id")),
        status=text(obj.get("status")),
        payment_status=text(obj.get("payment_status")),
        # Beyond a 32-bit amount no order could match it (and no column could hold it).
        amount_total=amount
        if isinstance(amount, int) and not isinstance(amount, bool) and 0 <= amount < 2**31
        else None,
        currency=text(obj.get("currency")),
        url=text(obj.get("url")),
        payment_intent=text(intent),
        expires_at=(
            datetime.fromtimestamp(expires, timezone.utc)
            if isinstance(expires, int) and not isinstance(expires, bool) and 0 <= expires < 2**37
            else None
        ),
        order_id=order_id,
        client_reference_id=text(obj.get("client_reference_id")),
        shop_mark=text(metadata.get("shop")) if isinstance(metadata, dict) else None,
    )


# The Idempotency-Key of the expire call a customer's cancel makes. Stripe copies a request's key
# into the events it causes (`event.request.idempotency_key`), so the `checkout.session.expired`
# notice of that expiry says it was the cancel's own doing, whichever of the two commits first.
CANCEL_EXPIRY_KEY_PREFIX = "backstop-cancel-"


def expired_by_a_cancel(event: dict) -> bool:
    """Was this event caused by the expire call of a customer's cancel (see CANCEL_EXPIRY_KEY_PREFIX)?"""
    request = event.get("request")
    key = request.get("idempotency_key") if isinstance(request, dict) else None
    return isinstance(key, str) and key.startswith(CANCEL_EXPIRY_KEY_PREFIX)


# What happens to a Checkout Session, as events (the types the bulk reconciliation lists).
SESSION_EVENT_TYPES = (
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
)


@dataclass(frozen=True)
class SessionEvent:
    """One event about a Checkout Session, as the events list gives it: the session as it was then."""

    id: str
    type: str
    created: int
    view: SessionView
    expired_by_cancel: bool

    @property
    def failed(self) -> bool:
        return self.type == "checkout.session.async_payment_failed"


@dataclass(frozen=True)
class EndpointView:
    id: str
    url: str
    status: str
    description: str | None
    secret: str | None = None
    enabled_events: tuple[str, ...] = ()


def endpoint_view(obj) -> EndpointView:
    data = obj.to_dict() if hasattr(obj, "to_dict") else obj
    return EndpointView(
        data["id"],
        data.get("url"),
        data.get("status"),
        data.get("description"),
        data.get("secret"),
        tuple(data.get("enabled_events") or ()),
    )
