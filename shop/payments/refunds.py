"""Late money goes back, and is followed until it has.

A paid session for an order that cannot take it (Cancelled, or already paid through another
session) becomes a Refund row plus a durable refund command, in the same transaction as the
webhook/return/sweep notice. The (order, session) unique key makes a second notice of the same
payment refund nothing more; the provider call carries an Idempotency-Key derived from (order,
session, attempt), so a retried command never refunds twice.

The provider's answer is not the end: a refund is `pending` until the provider says
`succeeded`, `failed` or `canceled` (shop.domain.refunds), by the create call's answer, a
`refund.updated` / `refund.failed` webhook, or the sweep's watch asking (`apply_refund_report`).
A refund whose money did not go back is never silent: the customer is emailed, the console counts
it, and an operator either refunds again (`retry_refund`: a new attempt with its own key, once
the provider has given the failed attempt's money back) or records that it was settled outside
the shop (`settle_refund`). This module is the one writer of `refunds`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Callable

from sqlalchemy import select

from ..domain.deadlines import utcnow
from ..domain.order import OrderStatus
from ..domain.refunds import (
    CANCELED,
    FAILED,
    NOT_RETURNED,
    PENDING,
    SUCCEEDED,
    RefundStatus,
    after_report,
    reported_status,
)
from ..extensions import db
from ..models import CommandKind, Refund
from ..outbox import schedule_command, uow
from ..outbox.failures import PermanentFailure
from ..provider import gateway
from ..store import order_store
from ..store.order_store import LoadedOrder
from .first_sighting import add_once

log = logging.getLogger("shop.payments")

# Why late money is refunded: the reason is the refund's metadata at the provider (and part of
# what its Idempotency-Key replays), so a restored copy that finds a payment the lost machine
# refunded records the same refund and not a second one.
PAID_TWICE = "paid twice: order already paid through another session"
PAID_AFTER_CANCEL = "payment arrived after the order was cancelled"


def refunded_by_shop(view) -> str | None:
    """The reason of this shop's own late-money refund of a paid session's whole payment, when the
    provider holds one (not failed or canceled), else None: one call to the provider. A restored
    copy asks before it applies a payment it did not see (shop.payments.apply, `refunded_as`): the
    machine it replaces may have given that money back already."""
    if not view.payment_intent or not view.amount_total:
        return None
    return late_money_reason(view, gateway.refunds_of_payment(view.payment_intent))


def late_money_reason(view, refunds) -> str | None:
    """Among the provider's `refunds`, this shop's late-money refund of the session's whole
    payment (not failed or canceled, not an operator's): its reason, else None."""
    mine = [
        r
        for r in refunds
        if r.status not in (gateway.RefundStatus.FAILED, gateway.RefundStatus.CANCELED)
        and r.refund_id is None
        and r.session_id == view.id
        and r.reason
    ]
    if not view.amount_total or not mine or sum(r.amount or 0 for r in mine) < view.amount_total:
        return None
    return mine[0].reason


def record_late_payment(order: LoadedOrder, view, reason: str, now: datetime) -> bool:
    session = db.session
    # Late money's own rows only (uq_refunds_order_session covers just those): an operator's
    # refund of part of a payment is not the refund of that payment arriving late.
    mine = (Refund.order_id == order.id, Refund.session_id == view.id, Refund.request_key.is_(None))
    refund = add_once(
        session,
        select(Refund.id).where(*mine),
        lambda: Refund(
            order_id=order.id,
            session_id=view.id,
            payment_intent_id=view.payment_intent,
            amount=view.amount_total,
            currency=(view.currency or order.currency),
            reason=reason,
            status=PENDING,
            attempts=1,
            created_at=now,
            updated_at=now,
        ),
    )
    if refund is None:  # recorded at an earlier notice of the same payment, or a concurrent one
        return False
    schedule_command(
        session, CommandKind.REFUND_PAYMENT, now, order_id=order.id, payload={"refund_id": refund.id}, now=now
    )
    log.warning(
        "order %s: %s; refunding %s %s (session %s)", order.reference, reason, view.amount_total, view.currency, view.id
    )
    return True


def record_operator_refund(
    order: LoadedOrder, *, amount: int, reason: str, request_key: str, operator: str, restock: bool, now: datetime
) -> Refund:
    """An operator's refund of (part of) a paid order: a Refund row named by the submission's
    `request_key` and a refund command, in the caller's transaction, followed to the provider's
    final word like late money (webhook, sweep's watch, retry or settle). The caller checked the
    amount against what is left (shop.domain.refunds.refundable) with the order locked."""
    refund = Refund(
        order_id=order.id,
        session_id=order.payment_session_id,
        amount=amount,
        currency=order.currency,
        reason=reason[:200],
        status=PENDING,
        attempts=1,
        request_key=request_key,
        requested_by=operator,
        restock=restock,
        created_at=now,
        updated_at=now,
    )
    db.session.add(refund)
    db.session.flush()  # a second submission of the same key fails here (IntegrityError)
    schedule_command(
        db.session, CommandKind.REFUND_PAYMENT, now, order_id=order.id, payload={"refund_id": refund.id}, now=now
    )
    log.warning(
        "order %s: %s refunds %s %s (%s)%s",
        order.reference,
        operator,
        amount,
        order.currency,
        reason,
        ", stock given back" if restock else "",
    )
    return refund


def execute_refund(refund_id: int, now: datetime) -> None:
    """Runs as a scheduled command; raising lets the runner retry with backoff / dead-letter.

    Makes the refund's current attempt at the provider, once: a refund the provider already
    holds for this attempt (its id is recorded) or that has an answer is left to the webhook and
    the sweep's watch."""
    refund = db.session.get(Refund, refund_id)
    if refund is None or refund.status != PENDING or refund.provider_refund_id or refund.settled_at is not None:
        return
    intent = refund.payment_intent_id
    if not intent:
        intent = gateway.retrieve_session(refund.session_id).payment_intent
        if not intent:
            # The session's `payment_intent` is nullable: without it there is nothing to refund
            # against yet. An ordinary failure: retried with backoff, then a dead letter an
            # operator sees, never a refund of the wrong payment.
            raise LookupError(
                f"the provider names no payment for session {refund.session_id} yet; refund {refund_id} cannot be made"
            )
    order_id, session_id, amount, reason, attempt, by_operator = (
        refund.order_id,
        refund.session_id,
        refund.amount,
        refund.reason,
        refund.attempts,
        refund.by_operator,
    )
    try:
        view = gateway.create_refund(
            order_id=order_id,
            session_id=session_id,
            payment_intent=intent,
            amount=amount,
            reason=reason,
            attempt=attempt,
            refund_id=refund_id if by_operator else None,
        )
    except gateway.ProviderRefused as exc:
        refund.last_error = str(exc)
        # Late money's whole payment already back is this refund done; an operator's part of a
        # payment that something else refunded in full is not: it dead-letters for a human.
        if exc.code == "charge_already_refunded" and not by_operator:
            refund.status = SUCCEEDED
            refund.payment_intent_id = intent
            end_watch_when_all_refunded(refund)
            return
        raise PermanentFailure(f"provider refused refund {refund_id}: {exc}") from exc
    # Read again, locked: the provider's webhook about this very refund may have been applied
    # while the call was answered (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialised it).
    refund = db.session.get(Refund, refund_id, populate_existing=True, with_for_update=True)
    if refund is None or refund.attempts != attempt:
        return
    refund.payment_intent_id = intent
    if refund.provider_refund_id not in (None, view.id):
        return
    refund.provider_refund_id = view.id
    refund.updated_at = now
    log.info(
        "refund %s for order %s, attempt %s: %s at the provider (%s)",
        refund.id,
        refund.order_id,
        attempt,
        reported_status(view.status),
        view.id,
    )
    _take_report(refund, view, now, "the provider's answer")


class ReportOutcome(StrEnum):
    """What a provider's report about a refund did (RefundReport.outcome)."""

    REFUND_SUCCEEDED = "refund_succeeded"
    REFUND_FAILED = "refund_failed"
    REFUND_CANCELED = "refund_canceled"
    NOOP = "noop"
    UNKNOWN_REFUND = "unknown_refund"


# The refund's new status -> what its report did.
_MOVED = {
    SUCCEEDED: ReportOutcome.REFUND_SUCCEEDED,
    FAILED: ReportOutcome.REFUND_FAILED,
    CANCELED: ReportOutcome.REFUND_CANCELED,
}


@dataclass
class RefundReport:
    outcome: ReportOutcome
    refund_id: int | None = None
    order_id: int | None = None
    detail: str = ""


def apply_refund_report(
    view: gateway.RefundView,
    *,
    source: str,
    now: datetime | None = None,
    before_commit: Callable[[RefundReport], None] | None = None,
) -> RefundReport:
    """What the provider says about one of its refunds (a webhook's object, or the sweep's
    `GET /v1/refunds/{id}`), applied to the shop's refund in one transaction. Idempotent and
    order-proof: a repeated or stale report changes nothing (shop.domain.refunds.after_report).
    `before_commit(report)` runs inside that transaction (the webhook's receipt)."""
    now = now or utcnow()
    with uow.transaction():
        report = _report_once(view, source, now)
        if before_commit is not None:
            before_commit(report)
    return report


def _report_once(view: gateway.RefundView, source: str, now: datetime) -> RefundReport:
    refund = _reported_refund(view)
    if refund is None:
        log.info("provider refund %s (via %s) is none of this shop's current refund attempts", view.id, source)
        return RefundReport(ReportOutcome.UNKNOWN_REFUND, detail=f"provider refund {view.id}")
    new = _take_report(refund, view, now, source)
    if new is None:
        return RefundReport(ReportOutcome.NOOP, refund.id, refund.order_id, f"refund {refund.id} is {refund.status}")
    return RefundReport(_MOVED[new], refund.id, refund.order_id)


def _reported_refund(view: gateway.RefundView) -> Refund | None:
    """The refund whose current attempt the report is about, locked: by the provider's refund id,
    or (the report came before the create call's answer was recorded) by the shop's metadata on
    it, only while that attempt has no provider id yet. A report about an earlier attempt, which
    failed before an operator retried, names no refund."""
    if not view.id:
        return None
    refund = db.session.execute(
        select(Refund).where(Refund.provider_refund_id == view.id).with_for_update()
    ).scalar_one_or_none()
    if refund is not None or view.order_id is None or not view.session_id:
        return refund
    # An operator's refund is one of several of its session: its metadata names the row.
    mine = Refund.id == view.refund_id if view.refund_id else Refund.request_key.is_(None)
    refund = db.session.execute(
        select(Refund)
        .where(Refund.order_id == view.order_id, Refund.session_id == view.session_id, mine)
        .with_for_update()
    ).scalar_one_or_none()
    if refund is None or refund.provider_refund_id is not None or refund.attempts != view.attempt:
        return None
    refund.provider_refund_id = view.id
    return refund


def _take_report(refund: Refund, view: gateway.RefundView, now: datetime, source: str) -> RefundStatus | None:
    """Move the refund as the provider's report says (or leave it), with what follows from the
    move in the same transaction: the customer's email, the end of the sweep's watch."""
    new = after_report(RefundStatus(refund.status), reported_status(view.status))  # the column holds its value
    if new is None:
        return None
    refund.status = new
    refund.updated_at = now
    if new in NOT_RETURNED:
        refund.failure_reason = (view.failure_reason or ("canceled" if new == CANCELED else "unknown"))[:100]
        refund.failed_at = now
        refund.last_error = (
            f"attempt {refund.attempts} ({refund.provider_refund_id}) {new} at the provider: {refund.failure_reason}"
        )
        log.error(
            "refund %s of order %s (%s %s, attempt %s, %s) %s at the provider (%s, via %s): the money did "
            "not go back; an operator must retry or settle it",
            refund.id,
            refund.order_id,
            refund.amount,
            refund.currency,
            refund.attempts,
            refund.provider_refund_id,
            new,
            refund.failure_reason,
            source,
        )
        _email(refund, "refund_failed", now)
    elif new == SUCCEEDED:
        log.info(
            "refund %s of order %s succeeded at the provider (%s, via %s)",
            refund.id,
            refund.order_id,
            refund.provider_refund_id,
            source,
        )
        end_watch_when_all_refunded(refund)
        _email(refund, "refund_issued", now)
    return new


def _email(refund: Refund, template: str, now: datetime) -> None:
    schedule_command(
        db.session, CommandKind.SEND_EMAIL, now, order_id=refund.order_id, payload={"template": template}, now=now
    )


# -- the sweep's watch -----------------------------------------------------------------------


def end_watch_when_all_refunded(refund: Refund) -> None:
    """The sweep watches a cancelled order with late money until its refunds have succeeded or
    were settled outside the shop (sweep.check_cancelled_payment); the last one ends the watch
    here, in the same transaction, rather than a sweep cycle later."""
    db.session.flush()
    others = db.session.execute(
        select(Refund.id).where(
            Refund.order_id == refund.order_id,
            Refund.id != refund.id,
            Refund.status != SUCCEEDED,
            Refund.settled_at.is_(None),
        )
    ).first()
    order = order_store.current_state(refund.order_id)
    # Only the watched session's own refund: a refund of some older session says nothing about
    # whether the current one can still take money.
    if (
        others is None
        and order is not None
        and order.status is OrderStatus.CANCELLED
        and order.payment_session_id == refund.session_id
    ):
        order_store.note(refund.order_id, order_store.Note.STOP_WATCHING)
