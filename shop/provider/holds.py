"""Payments held for a later capture (manual capture): take the money (`capture_payment`), give
the hold back without a refund (`void_payment`), or read where a payment stands
(`retrieve_payment`). Each goes through the gateway's guard (shop.provider.guarded), so the
budget, the breaker and the SDK's retries apply and failures come out as the gateway's errors:
a capture or void the payment's state does not allow (already captured, voided, or lapsed) is
ProviderRefused with code `payment_intent_unexpected_state`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from .guarded import guarded_call
from .payment_view import PaymentView, payment_view
from .transport import client

if TYPE_CHECKING:
    from stripe import PaymentIntent, RequestOptions
    from stripe.params import PaymentIntentCancelParams, PaymentIntentCaptureParams

CancellationReason = Literal["abandoned", "duplicate", "fraudulent", "requested_by_customer"]

# The error code of a capture or void the payment's status does not allow.
UNEXPECTED_STATE = "payment_intent_unexpected_state"
# Stripe's error code of a capture refused because the authorization lapsed.
CHARGE_EXPIRED_FOR_CAPTURE = "charge_expired_for_capture"


def capture_payment(intent_id: str, amount: int | None, idempotency_key: str) -> PaymentView:
    """Capture `amount` of a held payment (None: all that is capturable; the rest of a smaller
    capture goes back to the customer). The key makes a retried capture the same capture."""
    params: PaymentIntentCaptureParams = {"expand": ["latest_charge"]}
    if amount is not None:
        params["amount_to_capture"] = amount
    return _keyed(
        "capture payment",
        lambda options: client().v1.payment_intents.capture(intent_id, params=params, options=options),
        idempotency_key,
    )


def void_payment(intent_id: str, idempotency_key: str, *, reason: CancellationReason | None = None) -> PaymentView:
    """Cancel a held payment: the hold is released, nothing was taken, so nothing is refunded.
    `reason` is Stripe's `cancellation_reason` (abandoned, duplicate, fraudulent,
    requested_by_customer), sent only when given."""
    params: PaymentIntentCancelParams = (
        {"expand": ["latest_charge"]}
        if reason is None
        else {"expand": ["latest_charge"], "cancellation_reason": reason}
    )
    void = client().v1.payment_intents.cancel
    return _keyed("void payment", lambda options: void(intent_id, params=params, options=options), idempotency_key)


def _keyed(what: str, call: Callable[[RequestOptions], PaymentIntent], idempotency_key: str) -> PaymentView:
    """One guarded call about a held payment, under its idempotency key, as a PaymentView."""
    return payment_view(guarded_call(what, lambda: call({"idempotency_key": idempotency_key})))


def retrieve_payment(intent_id: str) -> PaymentView:
    """The payment now, its latest charge expanded (so its hold's `capture_before` is known)."""
    return payment_view(
        guarded_call(
            "retrieve payment",
            lambda: client().v1.payment_intents.retrieve(intent_id, params={"expand": ["latest_charge"]}),
        )
    )
