"""A card declined on the payment page (`payment_intent.payment_failed`): the session stays open
for another card, so the order stays PaymentInitiated; what the customer is told, and when, is
noted on the order (`Order.payment_declined_at`, `last_payment_error`) for its page to say."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from ..domain.deadlines import utcnow
from ..domain.order import OrderStatus
from ..outbox import uow
from ..provider import gateway
from ..store import order_store

log = logging.getLogger("shop.payments")

# The customer's words for the provider's card error codes (Stripe's `code`, and for
# card_declined its `decline_code`); anything else is told with the provider's own sentence,
# which Stripe writes for the customer, or the last line.
DECLINE_WORDS = {
    "insufficient_funds": "Your card was declined: it has insufficient funds.",
    "lost_card": "Your card was declined.",
    "stolen_card": "Your card was declined.",
    "expired_card": "Your card has expired.",
    "incorrect_cvc": "Your card's security code is incorrect.",
    "incorrect_number": "Your card number is incorrect.",
    "processing_error": "An error occurred while processing your card.",
    "card_declined": "Your card was declined.",
}
DEFAULT_WORDS = "Your payment did not go through."


def decline_words(view: gateway.PaymentFailureView) -> str:
    for code in (view.decline_code, view.code):
        if code in DECLINE_WORDS:
            return DECLINE_WORDS[code]
    return view.message or DEFAULT_WORDS


@dataclass
class DeclineNoted:
    outcome: str  # "declined" (noted on the order), "old_news", "unknown_order"
    order_id: int | None
    detail: str = ""


def note_payment_failure(
    view: gateway.PaymentFailureView,
    *,
    now: datetime | None = None,
    before_commit: Callable[[DeclineNoted], None] | None = None,
) -> DeclineNoted:
    """Note the decline on its order in one transaction (with `before_commit`, the webhook's
    receipt). Idempotent: a repeat writes the same words. A decline of an attempt the order has
    left (paid meanwhile, cancelled, a newer payment page) changes nothing."""
    now = now or utcnow()
    words = decline_words(view)
    with uow.transaction():
        order = order_store.read(view.order_id) if view.order_id is not None else None
        if order is None:
            noted = DeclineNoted("unknown_order", None, f"payment {view.payment_intent}")
        else:
            attempt = view.attempt if view.attempt is not None else order.payment_attempts
            if order.status is OrderStatus.PAYMENT_INITIATED and order_store.note_declined(
                order.id, attempt, words, now
            ):
                log.info("order %s: a card was declined on its payment page (%s)", order.reference, view.code)
                noted = DeclineNoted("declined", order.id, words)
            else:
                noted = DeclineNoted("old_news", order.id, f"order is {order.status}, attempt {order.payment_attempts}")
        if before_commit is not None:
            before_commit(noted)
    return noted
