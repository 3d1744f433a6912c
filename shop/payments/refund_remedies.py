"""An operator's remedies for a refund whose money did not go back (the console's): refund again
(`retry_refund`: a new attempt with its own key, once the provider has given the failed attempt's
money back) or record that it was settled outside the shop (`settle_refund`). Following a refund
to its end is `payments.refunds`. Each answers a `RefundAction`, codes and facts: the console says
it in words (console/refund_words.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import select

from ..domain.deadlines import utcnow
from ..domain.order import OrderStatus
from ..domain.refunds import PENDING, SUCCEEDED, RefundStatus, needs_operator
from ..domain.results import SubmissionOutcome
from ..extensions import db
from ..models import CommandKind, Order, Refund
from ..outbox import schedule_command, uow
from ..store import order_store
from .refunds import end_watch_when_all_refunded

log = logging.getLogger("shop.payments")


class Remedy(StrEnum):
    """Which remedy an operator asked for."""

    RETRY = "retry"  # retry_refund
    SETTLE = "settle"  # settle_refund


# What an operator's remedy did, as any operator's submission: MISSING is no such refund.
ActionOutcome = SubmissionOutcome


class NotNow(StrEnum):
    """Why a remedy was refused: the refund needs no operator (any more), or not this one."""

    SETTLED = "settled"  # already recorded as settled outside the shop (a settle: with another reason)
    PENDING = "pending"  # the provider has not answered the attempt yet
    SUCCEEDED = "succeeded"  # the money went back
    CHANGED = "changed"  # the refund moved past the attempt the operator saw


@dataclass
class RefundAction:
    """A remedy's answer: what it did (`outcome`) to which refund, with the facts its words need.
    `refund` is refund_facts (None when missing); `why` says why a REFUSED one was; `seen` the
    attempt the operator looked at; a retry DONE also has the failed attempt it sends again
    (`failed_error`, the provider's error if any, and `failed_status`)."""

    remedy: Remedy
    outcome: ActionOutcome
    refund_id: int
    refund: dict | None = None
    why: NotNow | None = None
    seen: int | None = None
    failed_error: str | None = None
    failed_status: str | None = None


def refund_facts(refund: Refund) -> dict:
    """What an operator's answer reports about a refund (read before the transaction ends)."""
    return {
        "id": refund.id,
        "order_id": refund.order_id,
        "status": refund.status,
        "attempts": refund.attempts,
        "provider_refund_id": refund.provider_refund_id,
        "failure_reason": refund.failure_reason,
        "settled_at": refund.settled_at,
        "settled_by": refund.settled_by,
        "settlement_reason": refund.settlement_reason,
        "amount": refund.amount,
        "currency": refund.currency,
    }


def retry_refund(refund_id: int, *, seen_attempt: int | None, now: datetime | None = None) -> RefundAction:
    """Refund again a refund whose money did not go back: its next attempt, with its own
    Idempotency-Key, made by a refund command (retried, waiting for the provider, dead-lettered
    like the first). The provider gave the failed attempt's money back to the payment, so the
    money goes back once in all. `seen_attempt` is the attempt the operator looked at: the same
    submission sent twice retries once, and a retry of an attempt already retried is refused."""
    now = now or utcnow()
    with uow.transaction() as session:
        refund = session.get(Refund, refund_id, with_for_update=True)
        if refund is None:
            return RefundAction(Remedy.RETRY, ActionOutcome.MISSING, refund_id)
        seen = refund.attempts if seen_attempt is None else seen_attempt
        if seen_attempt is not None and refund.attempts == seen + 1 and refund.settled_at is None:
            return RefundAction(Remedy.RETRY, ActionOutcome.ALREADY, refund_id, refund_facts(refund), seen=seen)
        if not needs_operator(RefundStatus(refund.status), refund.settled_at is not None) or refund.attempts != seen:
            return RefundAction(
                Remedy.RETRY, ActionOutcome.REFUSED, refund_id, refund_facts(refund), _why_not(refund), seen
            )
        failed_error, failed_status = refund.last_error, refund.status
        failed = failed_error or f"attempt {refund.attempts} {failed_status}"
        refund.attempts += 1
        refund.status = PENDING
        refund.provider_refund_id = None
        refund.updated_at = now
        schedule_command(
            session,
            CommandKind.REFUND_PAYMENT,
            now,
            order_id=refund.order_id,
            payload={"refund_id": refund.id},
            now=now,
        )
        _watch_again(refund, now)
        log.warning(
            "refund %s of order %s: sent again as attempt %s (%s)", refund.id, refund.order_id, refund.attempts, failed
        )
        return RefundAction(
            Remedy.RETRY,
            ActionOutcome.DONE,
            refund_id,
            refund_facts(refund),
            seen=seen,
            failed_error=failed_error,
            failed_status=failed_status,
        )


def settle_refund(refund_id: int, *, reason: str, operator: str, now: datetime | None = None) -> RefundAction:
    """Record that a refund whose money did not go back was settled outside the shop (a bank
    transfer, a voucher the customer agreed to): who, when and why. The provider's status stays
    what it was; the refund no longer waits for anyone."""
    now = now or utcnow()
    with uow.transaction() as session:
        refund = session.get(Refund, refund_id, with_for_update=True)
        if refund is None:
            return RefundAction(Remedy.SETTLE, ActionOutcome.MISSING, refund_id)
        if refund.settled_at is not None:
            if (refund.settlement_reason or "") == reason:
                return RefundAction(Remedy.SETTLE, ActionOutcome.ALREADY, refund_id, refund_facts(refund))
            return RefundAction(Remedy.SETTLE, ActionOutcome.REFUSED, refund_id, refund_facts(refund), NotNow.SETTLED)
        if not needs_operator(RefundStatus(refund.status), False):
            return RefundAction(
                Remedy.SETTLE,
                ActionOutcome.REFUSED,
                refund_id,
                refund_facts(refund),
                _why_not(refund),
                refund.attempts,
            )
        refund.settled_at, refund.settled_by, refund.settlement_reason = now, operator, reason
        refund.updated_at = now
        end_watch_when_all_refunded(refund)
        log.warning(
            "refund %s of order %s recorded as settled outside the shop by %s: %s",
            refund.id,
            refund.order_id,
            operator,
            reason,
        )
        return RefundAction(Remedy.SETTLE, ActionOutcome.DONE, refund_id, refund_facts(refund))


def _why_not(refund: Refund) -> NotNow:
    """Why a remedy cannot act on this refund now."""
    if refund.settled_at is not None:
        return NotNow.SETTLED
    if refund.status == PENDING:
        return NotNow.PENDING
    if refund.status == SUCCEEDED:
        return NotNow.SUCCEEDED
    return NotNow.CHANGED


def _watch_again(refund: Refund, now: datetime) -> None:
    """A retried late-money refund of a cancelled order is followed by the sweep again, as the
    first attempt was (sweep.check_cancelled_payment), should its webhook be lost."""
    order = db.session.execute(
        select(Order.status, Order.payment_session_id, Order.late_money_watch_since).where(Order.id == refund.order_id)
    ).first()
    if (
        order is not None
        and order.status is OrderStatus.CANCELLED
        and order.payment_session_id == refund.session_id
        and order.late_money_watch_since is None
    ):
        order_store.note(refund.order_id, order_store.Note.WATCH, now)
