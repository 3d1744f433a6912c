"""A payment (Stripe's PaymentIntent) as a plain value, `PaymentView`, and what says it is held
for a later capture: the card's capture method, the amount capturable, and the latest charge's
`payment_method_details.card.capture_before` (when the hold lapses). Read from a stripe object or
an event's JSON, as the other views are (shop.provider.views)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from enum import StrEnum


class PaymentIntentStatus(StrEnum):
    REQUIRES_PAYMENT_METHOD = "requires_payment_method"
    REQUIRES_CONFIRMATION = "requires_confirmation"
    REQUIRES_ACTION = "requires_action"
    PROCESSING = "processing"
    REQUIRES_CAPTURE = "requires_capture"
    CANCELED = "canceled"
    SUCCEEDED = "succeeded"


class CaptureMethod(StrEnum):
    AUTOMATIC = "automatic"
    AUTOMATIC_ASYNC = "automatic_async"
    MANUAL = "manual"


@dataclass(frozen=True)
class Hold:
    """What a payment says about capture: `capture_method` is the card's (its
    `payment_method_options.card.capture_method`, else the intent's own); `amount_capturable`
    is what a capture may still take; `capture_before`, from the latest charge when the answer
    expanded it (else None), is when an uncaptured hold lapses."""

    capture_method: CaptureMethod | str | None = None
    amount_capturable: int | None = None
    capture_before: datetime | None = None


NO_HOLD = Hold()


@dataclass(frozen=True)
class PaymentView:
    id: str
    status: PaymentIntentStatus | str | None
    amount: int | None
    amount_received: int | None
    cancellation_reason: str | None
    latest_charge: str | None
    order_id: int | None  # from metadata.order_id
    hold: Hold = NO_HOLD

    @property
    def held(self) -> bool:
        """Money authorized and waiting for a capture or a void."""
        return self.status == PaymentIntentStatus.REQUIRES_CAPTURE


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value) -> dict:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    return value if isinstance(value, dict) else {}


def hold_of(intent: dict) -> Hold:
    card_options = _dict(_dict(intent.get("payment_method_options")).get("card"))
    charge = _dict(intent.get("latest_charge"))
    before = _dict(_dict(charge.get("payment_method_details")).get("card")).get("capture_before")
    return Hold(
        capture_method=_text(card_options.get("capture_method")) or _text(intent.get("capture_method")),
        amount_capturable=_int(intent.get("amount_capturable")),
        capture_before=(
            datetime.fromtimestamp(before, timezone.utc)
            if isinstance(before, int) and not isinstance(before, bool) and 0 <= before < 2**37
            else None
        ),
    )


def payment_view(obj) -> PaymentView:
    """Accepts a stripe object or a plain dict (an event's data.object); a malformed field reads
    as absent."""
    intent = _dict(obj)
    metadata = _dict(intent.get("metadata"))
    raw_order = metadata.get("order_id")
    charge = intent.get("latest_charge")
    return PaymentView(
        id=_text(intent.get("id")) or "",
        status=_text(intent.get("status")),
        amount=_int(intent.get("amount")),
        amount_received=_int(intent.get("amount_received")),
        cancellation_reason=_text(intent.get("cancellation_reason")),
        latest_charge=_text(_dict(charge).get("id")) if not isinstance(charge, str) else charge,
        order_id=int(raw_order) if isinstance(raw_order, str) and raw_order.isdigit() and len(raw_order) < 12 else None,
        hold=hold_of(intent),
    )
