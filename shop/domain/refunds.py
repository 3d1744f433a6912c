"""A refund's life at the provider, as the shop records it: pure rules, no database.

A refund is `pending` until the provider says `succeeded`, `failed` or `canceled`
(docs/REFERENCE.md, Order states). The news comes by webhook (`refund.updated`,
`refund.failed`), by the sweep's watch asking, or in the answer to the call that made the
refund, in any order and more than once: these rules make every order of arrival end the same.
A refund whose money did not go back waits for an operator, who either has the shop refund again
(a new attempt, with its own Idempotency-Key) or records that it was settled outside the shop.
"""

from __future__ import annotations

from enum import StrEnum


class RefundStatus(StrEnum):
    """A refund attempt's status, spelled as the provider spells it (and as the column holds it)."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


PENDING, SUCCEEDED, FAILED, CANCELED = RefundStatus
STATUSES = tuple(RefundStatus)
# The money did not go back: an operator's problem until retried or settled outside the shop.
NOT_RETURNED = (FAILED, CANCELED)


def reported_status(raw) -> RefundStatus:
    """The provider's word for a refund, in the shop's four. Stripe's `status` is nullable and has
    `requires_action` besides the four (a refund waiting for the customer's bank details): both,
    and anything this code does not know, are still pending, so the refund is asked about again
    rather than taken for money returned."""
    return RefundStatus(raw) if raw in (SUCCEEDED, FAILED, CANCELED) else PENDING


def after_report(current: RefundStatus, reported: RefundStatus) -> RefundStatus | None:
    """What the current attempt's status becomes when the provider reports `reported` about it,
    or None when nothing changes.

    pending -> anything final. succeeded -> failed: Stripe reports a refund that the customer's
    bank sends back after it had succeeded (a closed account) as failed. failed and canceled are
    final for the attempt: a stale or repeated notice (a reordered `refund.updated` that still
    says pending or succeeded) changes nothing."""
    if reported == current:
        return None
    if current == PENDING and reported != PENDING:
        return reported
    if current == SUCCEEDED and reported == FAILED:
        return FAILED
    return None


def needs_operator(status: RefundStatus, settled: bool) -> bool:
    """The money did not go back and nobody has dealt with it yet."""
    return status in NOT_RETURNED and not settled


def charged_for(total: int, charged: int | None) -> int:
    """What an order's payment charged: its `charged` (the total plus any tax), or the total for a
    payment saved before the charge was (every payment then charged exactly the total)."""
    return total if charged is None else charged


def refundable(paid: int, refunded: list[int]) -> int:
    """What is left of a payment to refund: what was paid less every refund already made of it,
    pending, succeeded, settled outside the shop or failed (a failed one's money waits for an
    operator's retry, which would take it)."""
    return max(0, paid - sum(refunded))


def refund_amount_problem(amount: int | None, left: int) -> str | None:
    """Why an operator's refund amount cannot be refunded (a code), or None: `not_positive`,
    `nothing_left`, `over_refundable`."""
    if amount is None or amount <= 0:
        return "not_positive"
    if left <= 0:
        return "nothing_left"
    if amount > left:
        return "over_refundable"
    return None


class PaidAndRefunded(StrEnum):
    """How much of a paid order's payment went back (docs/REFERENCE.md, Order states)."""

    PAID = "paid"
    PARTIALLY_REFUNDED = "partially_refunded"
    REFUNDED = "refunded"


def paid_and_refunded(charged: int, refunded: int) -> PaidAndRefunded:
    """`refunded`: the sum of the payment's succeeded refunds."""
    if refunded <= 0:
        return PaidAndRefunded.PAID
    return PaidAndRefunded.REFUNDED if refunded >= charged else PaidAndRefunded.PARTIALLY_REFUNDED
