"""The provider's objects as plain values: a Checkout Session (`SessionView`), a refund
(`RefundView`), a session's event (`SessionEvent`) and a webhook endpoint (`EndpointView`), read
from a stripe object or from an event's JSON, so no stripe object (which in stripe 16 is not a
dict) leaks into the shop; and the event types the shop listens to."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import StrEnum

from ..domain.payment import NO_TAX_REPORTED, SessionTax
from .payment_view import NO_HOLD, Hold, hold_of


# The provider's own vocabularies, as it documents them (read as sent: a value outside them is
# passed on as it is, and an absent or malformed one reads as None). StrEnums: a member equals
# the provider's spelling, so a view's plain string compares with them as it is.
class SessionStatus(StrEnum):
    OPEN = "open"
    COMPLETE = "complete"
    EXPIRED = "expired"


class SessionPaymentStatus(StrEnum):
    PAID = "paid"
    UNPAID = "unpaid"
    NO_PAYMENT_REQUIRED = "no_payment_required"


class RefundStatus(StrEnum):
    PENDING = "pending"
    REQUIRES_ACTION = "requires_action"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


class EndpointStatus(StrEnum):
    ENABLED = "enabled"
    DISABLED = "disabled"


EVENT_TYPES = [
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
    "refund.updated",
    "refund.failed",
    "payment_intent.payment_failed",
    "payment_intent.canceled",
    "charge.expired",
]
# A refund's news (docs/REFERENCE.md, Webhook): its object is the refund, not a session.
REFUND_EVENT_TYPES = ("refund.updated", "refund.failed")
# A card refused on the payment page (docs/REFERENCE.md, Webhook): its object is the payment
# attempt's PaymentIntent; the session stays open for another card, so no session event comes.
PAYMENT_FAILURE_EVENT_TYPES = ("payment_intent.payment_failed",)
# A held payment ended uncaptured (CAPTURE_MODE=dispatch): voided, or its hold lapsed. Its object is
# the PaymentIntent (payments.holds.hold_ended).
HOLD_END_EVENT_TYPES = ("payment_intent.canceled",)
# A held payment's charge lapsed uncaptured: its object is the charge, which names its PaymentIntent
# but not the order (payments.holds.hold_lapsed asks for the payment).
HOLD_LAPSE_EVENT_TYPES = ("charge.expired",)


def _object(value) -> dict:
    """A JSON object of the sender's, or an empty one when the field is absent or not an object."""
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class PaymentFailureView:
    """A failed attempt to pay, from its PaymentIntent: which order and payment attempt (the
    metadata the shop gave the session's payment), and the card error as the provider says it."""

    payment_intent: str | None
    order_id: int | None
    attempt: int | None
    code: str | None  # card_declined, expired_card, incorrect_cvc, ...
    decline_code: str | None  # insufficient_funds, lost_card, ... (card_declined only)
    message: str | None  # the provider's own sentence for the customer


def payment_failure_view(obj) -> PaymentFailureView:
    """Read as defensively as `session_view`: a field of the wrong type reads as absent."""
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        obj = {}
    metadata, error = _object(obj.get("metadata")), _object(obj.get("last_payment_error"))

    def text(value, limit=300):
        return value[:limit] if isinstance(value, str) and value else None

    def number(value):
        return int(value) if isinstance(value, str) and value.isdigit() and len(value) < 10 else None

    return PaymentFailureView(
        payment_intent=text(obj.get("id"), 255),
        order_id=number(metadata.get("order_id")),
        attempt=number(metadata.get("attempt")),
        code=text(error.get("code"), 100),
        decline_code=text(error.get("decline_code"), 100),
        message=text(error.get("message")),
    )


@dataclass(frozen=True)
class SessionView:
    id: str
    # The provider's vocabularies; a value outside them is passed on as sent (see above).
    status: SessionStatus | str | None
    payment_status: SessionPaymentStatus | str | None
    amount_total: int | None
    currency: str | None
    url: str | None
    payment_intent: str | None
    expires_at: datetime | None
    order_id: int | None  # from metadata.order_id
    client_reference_id: str | None
    shop_mark: str | None = None  # from metadata.shop: which shop made the session (shop.provider.mark)
    # Where the customer asked for the goods to go, when the session collected it
    # (`collected_information.shipping_details`, or `shipping_details` before Stripe's 2025 API):
    # {"name", "address": {"line1", "line2", "city", "postal_code", "state", "country"}}.
    shipping_details: dict | None = None
    # How much of the payment has been refunded, by anyone (`payment_intent.latest_charge
    # .amount_refunded`): known only when the answer expanded it (a retrieve does; an event's
    # object does not), else None.
    amount_refunded: int | None = None
    # What the session says about tax (automatic_tax, amount_subtotal, total_details.amount_tax):
    # the proof checks it against TAX_MODE (shop.domain.payment).
    tax: SessionTax = NO_TAX_REPORTED
    # A payment held for a later capture (shop.provider.payment_view.Hold), when the answer
    # expanded the payment (a retrieve does; an event's object does not), else NO_HOLD.
    hold: Hold = NO_HOLD


def _amount(value) -> int | None:
    """A minor-unit amount as an order's column holds one; anything else reads as absent."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None


def session_tax_of(obj: dict) -> SessionTax:
    """Read the same way in every API version the shop can meet (automatic_tax, amount_subtotal and
    total_details have kept their shape since 2020): a field of the wrong type reads as absent."""
    automatic = _object(obj.get("automatic_tax"))
    enabled, status = automatic.get("enabled"), automatic.get("status")
    return SessionTax(
        enabled=enabled if isinstance(enabled, bool) else None,
        status=status if isinstance(status, str) else None,
        amount_subtotal=_amount(obj.get("amount_subtotal")),
        amount_tax=_amount(_object(obj.get("total_details")).get("amount_tax")),
    )


ADDRESS_FIELDS = ("line1", "line2", "city", "postal_code", "state", "country")


def shipping_details_of(obj: dict) -> dict | None:
    """A session's collected shipping details in the shop's shape, read defensively (the event is
    the sender's JSON): text fields only, cut to a length a column and a page can show; None when
    there is no name and no first line to ship to."""
    collected = obj.get("collected_information")
    details = collected.get("shipping_details") if isinstance(collected, dict) else None
    if not isinstance(details, dict):
        details = obj.get("shipping_details")
    if not isinstance(details, dict):
        return None
    address = _object(details.get("address"))

    def text(value, limit=200):
        return value.strip()[:limit] or None if isinstance(value, str) else None

    shaped = {
        "name": text(details.get("name")),
        "address": {key: text(address.get(key)) for key in ADDRESS_FIELDS},
    }
    if not shaped["name"] and not shaped["address"]["line1"]:
        return None
    return shaped


@dataclass(frozen=True)
class RefundView:
    id: str | None
    status: RefundStatus | str | None  # nullable at the provider; outside the vocabulary, as sent
    amount: int | None
    payment_intent: str | None  # nullable at Stripe
    failure_reason: str | None  # only on a failed refund
    order_id: int | None  # from metadata: the shop's own (order, session, attempt)
    session_id: str | None
    attempt: int | None
    refund_id: int | None = None  # from metadata: an operator's refund names the shop's row
    reason: str | None = None  # from metadata: why the shop refunded (late money's reason)


def refund_view(obj) -> RefundView:
    """Accepts a stripe object or a plain dict (an event's data.object), read as defensively as
    `session_view`: a field of the wrong type reads as absent."""
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        obj = {}
    metadata = _object(obj.get("metadata"))

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
        reason=text(metadata.get("reason")),
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
    # Unexpanded, the payment says nothing; the session still says whether it asked for card
    # payments to be held (`payment_method_options.card.capture_method`).
    refunded, hold = None, Hold(capture_method=_card_capture(obj))
    if isinstance(intent, dict):
        hold = hold_of(intent)
        charge = intent.get("latest_charge")
        if isinstance(charge, dict):
            refunded = charge.get("amount_refunded")
        intent = intent.get("id")
    expires = obj.get("expires_at")
    amount = obj.get("amount_total")

    def text(value):
        return value if isinstance(value, str) else None

    return SessionView(
        id=text(obj.get("id")) or "",  # absent or malformed: no session has it, so no order is found
        status=text(obj.get("status")),
        payment_status=text(obj.get("payment_status")),
        # Beyond a 32-bit amount no order could match it (and no column could hold it).
        amount_total=_amount(amount),
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
        shipping_details=shipping_details_of(obj),
        amount_refunded=_amount(refunded),
        tax=session_tax_of(obj),
        hold=hold,
    )


def _card_capture(session: dict) -> str | None:
    options = session.get("payment_method_options")
    card = options.get("card") if isinstance(options, dict) else None
    method = card.get("capture_method") if isinstance(card, dict) else None
    return method if isinstance(method, str) else None


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
    # The session as the event carried it (`data.object`), so the event can be kept and read again.
    object: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def failed(self) -> bool:
        return self.type == "checkout.session.async_payment_failed"

    def kept(self) -> str:
        """The event as JSON, for a cache that hands it to another process (`from_kept`)."""
        return json.dumps([self.id, self.type, self.created, self.object, self.expired_by_cancel])

    @classmethod
    def from_kept(cls, text: str | bytes) -> SessionEvent:
        event_id, kind, created, obj, by_cancel = json.loads(text)
        return cls(str(event_id), str(kind), int(created), session_view(obj), bool(by_cancel), obj)


@dataclass(frozen=True)
class EndpointView:
    id: str
    url: str
    status: EndpointStatus | str
    description: str | None
    secret: str | None = None
    enabled_events: tuple[str, ...] = ()
    # The API version its events are rendered in; None: the account's default, whatever it is.
    api_version: str | None = None


def endpoint_view(obj) -> EndpointView:
    data = obj.to_dict() if hasattr(obj, "to_dict") else obj
    return EndpointView(
        data["id"],
        data.get("url"),
        data.get("status"),
        data.get("description"),
        data.get("secret"),
        tuple(data.get("enabled_events") or ()),
        data.get("api_version") or None,
    )
