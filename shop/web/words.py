"""The customer's words for an order's state (its badge is the order view's, in serialize.py).
The JSON keeps the codes (the state names of docs/REFERENCE.md, Order states); the pages and
messages say these."""

from __future__ import annotations

from ..domain.order import OrderStatus
from ..orders.cancel import CancelConflict

# What a customer reads for each state (the JSON keeps the state names of docs/REFERENCE.md, Order states).
STATUS_WORDS = {
    OrderStatus.PENDING_PAYMENT: "Awaiting payment",
    OrderStatus.PAYMENT_INITIATED: "At the payment page",
    OrderStatus.PAYMENT_FAILED: "Payment failed",
    OrderStatus.PAID: "Paid",
    OrderStatus.AUTHORIZED: "Payment authorized",
    OrderStatus.CANCELLED: "Cancelled",
}


def status_words(status: str) -> str:
    try:
        return STATUS_WORDS[OrderStatus(status)]
    except ValueError:  # not an order's state: shown as it is
        return str(status)


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
