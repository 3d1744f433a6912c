"""Why a refund did not go through, in the customer's words: the order page and the refund-failed
email say the same (both read it from here; the email sits below the web layer)."""

from __future__ import annotations

# Why a refund did not go through, in the customer's words, by the provider's `failure_reason`
# (Stripe's values); anything else gets the last line.
REFUND_FAILURE_WORDS = {
    "expired_or_canceled_card": "the card it would go back to has expired or was cancelled",
    "lost_or_stolen_card": "the card it would go back to was reported lost or stolen",
    "declined": "your bank declined it",
    None: "the payment provider could not complete it",
}


def refund_failure_words(reason: str | None) -> str:
    return REFUND_FAILURE_WORDS.get(reason, REFUND_FAILURE_WORDS[None])
