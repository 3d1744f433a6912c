"""The customer's words for an order's state and its badge. The JSON keeps the codes (the state
names of docs/REFERENCE.md, Order states); the pages and messages say these."""

from __future__ import annotations

from ..domain.order import OrderStatus
from ..domain.refunds import NOT_RETURNED, PENDING, SUCCEEDED
from ..orders.cancel import CancelConflict

# What a customer reads for each state (the JSON keeps the state names of docs/REFERENCE.md, Order states).
STATUS_WORDS = {
    OrderStatus.PENDING_PAYMENT: "Awaiting payment",
    OrderStatus.PAYMENT_INITIATED: "At the payment page",
    OrderStatus.PAYMENT_FAILED: "Payment failed",
    OrderStatus.PAID: "Paid",
    OrderStatus.CANCELLED: "Cancelled",
}


def status_words(status: str) -> str:
    try:
        return STATUS_WORDS[OrderStatus(status)]
    except ValueError:  # not an order's state: shown as it is
        return str(status)


# The badge a customer sees for an order, in the words of the page's own text: the state alone
# does not say enough ("At the payment page" for a payment the provider is settling, "Cancelled"
# for an order whose window ran out), so the payment and the cancellation's reason count too.
BADGES = {
    "awaiting": "Awaiting payment",
    "in-line": "In line for payment",
    "at-payment-page": "At the payment page",
    "declined": "Card declined",
    "processing": "Payment processing",
    "failed": "Payment failed",
    "paid": "Paid",
    "expired": "Expired",
    "cancelled": "Cancelled",
    "refund-pending": "Cancelled, refund on its way",
    "refund-failed": "Cancelled, refund did not go through",
    "refunded": "Cancelled, refunded",
}


def badge(data: dict) -> tuple[str, str]:
    """(key, words) for an order's JSON as `order_json` makes it, with `cancelled_because` added
    for a cancelled order. The key is also the badge's CSS class."""
    status = OrderStatus(data["status"])
    payment = (data.get("payment") or {}).get("status")
    if payment == "queued":
        key = "in-line"
    elif status is OrderStatus.PENDING_PAYMENT:
        key = "awaiting"
    elif status is OrderStatus.PAYMENT_INITIATED:
        at_payment_page: dict[str | None, str] = {"processing": "processing", "declined": "declined"}
        key = at_payment_page.get(payment, "at-payment-page")
    elif status is OrderStatus.PAYMENT_FAILED:
        key = "failed"
    elif status is OrderStatus.PAID:
        key = "paid"
    else:
        # A refund an operator settled outside the shop is done, whatever the provider said.
        settled = set(data.get("refunds_settled") or ())
        refunds = [r["status"] for r in data.get("refunds") or [] if r["id"] not in settled]
        if any(refund in NOT_RETURNED for refund in refunds):
            key = "refund-failed"
        elif PENDING in refunds:
            key = "refund-pending"
        elif SUCCEEDED in refunds or settled:
            key = "refunded"
        else:
            key = "expired" if data.get("cancelled_because") == "expired" else "cancelled"
    return key, BADGES[key]


def cancel_conflict_words(outcome) -> str:
    """What the customer reads when their cancel met an order that had moved (a `CancelOutcome`
    of status conflict): the state it is in now, and whether it moved before or during the cancel."""
    now = status_words(outcome.order.status)
    if outcome.code is CancelConflict.CHANGED_WHILE_CANCELLING:
        return f"This order changed while you were cancelling it (it is now: {now}). Look at it again."
    return (
        f"This order changed since you loaded it (it is now: {now}, perhaps in another tab). "
        "Look at it again before cancelling."
    )
