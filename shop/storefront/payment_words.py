"""What a customer is told about a payment's start and a cancel the payment stops: the use cases
(payments.start) say what happened as codes and facts, this says it in words."""

from __future__ import annotations

from ..payments.start import PAYMENT_ALREADY_COMPLETED, StartCode, StartOutcome

IN_LINE = (
    "Your order is placed and its items are held for you. Many customers are paying right now, so you are "
    "in line for the payment page: this page takes you there by itself as soon as it is your turn. "
    "There is nothing to click."
)

_START_WORDS = {
    StartCode.IN_LINE: IN_LINE,
    StartCode.UNREACHABLE: "We could not reach the payment provider. Your order is saved "
    "and your items are held; please try “Pay now” again in a moment.",
    StartCode.PROVIDER_REFUSED: "We could not start the payment: the payment provider turned "
    "the request down. Nothing was charged, and your order and its "
    "items are held until its payment window closes; our team can "
    "see why. Please try “Pay now” again later or contact us.",
    StartCode.NO_PAGE: "We could not open the payment page just now: the payment provider "
    "did not give us its address. Nothing was charged, and your order "
    "and its items are held; please try “Pay now” again in a moment.",
    StartCode.NO_SUCH_ORDER: "No such order.",
}

ALREADY_PAID = "This order has already been paid, so it can no longer be cancelled. Contact us if you want a refund."


def start_words(outcome: StartOutcome) -> str:
    """The sentence for a payment's start that did not go to the payment page ("" when it did)."""
    code = outcome.code
    if code is StartCode.NOT_PAYABLE:
        assert outcome.order_status is not None, "a start refused as not payable names the order's status"
        return f"This order is {outcome.order_status.value}; it cannot be paid now."
    if code is StartCode.CHANGED:
        status = outcome.order_status.value if outcome.order_status is not None else "gone"
        return f"This order changed meanwhile (now {status}); please reload it."
    if code in (StartCode.TRANSITION_REFUSED, StartCode.STILL_IN_LINE):
        return outcome.detail
    return _START_WORDS.get(code, "")


def cancel_refusal_words(code: str | None, message: str) -> str:
    """A refused cancel's sentence: the payment that stands in its way is said here; any other
    refusal keeps the domain's own words."""
    return ALREADY_PAID if code == PAYMENT_ALREADY_COMPLETED else message
