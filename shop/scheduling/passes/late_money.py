"""The late-money watch, part of the provider pass: a cancelled order whose session could still
take money is asked about until the money cannot come, or has come and been refunded. Money
that arrives is refunded through the webhook's path; its refund is followed until the provider
has it (a pending one asked about, a dead one run again)."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import or_, select

from ...domain.deadlines import FAILURE_REFUSED, as_utc
from ...domain.order import OrderStatus
from ...domain.refunds import RefundStatus
from ...extensions import db
from ...models import CommandKind, Order, Refund, ScheduledCommand, WorkStatus
from ...outbox import dispatch
from ...payments import apply as payments
from ...payments.refunds import ReportOutcome, apply_refund_report
from ...provider import gateway
from ...store import order_store
from ..cycle import NOT_ASKED, ProviderOutcome, not_answered
from .provider import Backoff, backoff_provider_checks

log = logging.getLogger("shop.sweep")
S = OrderStatus
P = ProviderOutcome


def watched_cancelled_ids(now: datetime, limit: int) -> list[int]:
    """Cancelled orders whose session could still take money (see payments.start
    `retire_session_before_cancel`), oldest mark first, skipping those backed off until later. The mark
    is rare and indexed (ix_orders_late_money_watch_since), so this reads only marked rows."""
    rows = (
        db.session.execute(
            select(Order.id)
            .where(
                Order.late_money_watch_since.is_not(None),
                Order.status == S.CANCELLED,
                or_(Order.provider_next_check_at.is_(None), Order.provider_next_check_at <= now),
            )
            .order_by(Order.late_money_watch_since, Order.id)
            .limit(limit)
        )
        .scalars()
        .all()
    )
    db.session.rollback()
    return list(rows)


def check_cancelled_payment(order_id: int, now: datetime) -> ProviderOutcome:
    """Ask the provider about a cancelled order's session that could still take money: paid ->
    the same late-money path as the webhook (one refund, however often asked); failed, expired or
    gone -> stop watching; still pending (or still open) -> ask again later. The webhook usually
    did this first; this is what makes a lost one harmless.

    Once the money is in, the watch follows its refund until the provider has it: a refund still
    waiting for the provider keeps the order watched, and one that died of anything but a refusal
    runs again (the watch ends only when every refund of the order has succeeded)."""
    session = db.session
    order = session.get(Order, order_id, populate_existing=True)
    if (
        order is None
        or order.status is not S.CANCELLED
        or order.late_money_watch_since is None
        or not order.payment_session_id
    ):
        session.rollback()
        return P.CHANGED
    session_id, reference, since = order.payment_session_id, order.reference, as_utc(order.late_money_watch_since)
    refunds = session.execute(
        select(Refund.id, Refund.session_id, Refund.status, Refund.provider_refund_id, Refund.settled_at).where(
            Refund.order_id == order_id
        )
    ).all()
    session.rollback()
    if any(r.session_id == session_id for r in refunds):
        return _follow_refunds(
            order_id,
            reference,
            [r for r in refunds if r.status != RefundStatus.SUCCEEDED and r.settled_at is None],
            since,
            now,
        )
    try:
        view = gateway.retrieve_session(session_id)
        failed = payments.async_failed(view)
    except gateway.ProviderUnavailable as exc:
        return not_answered(exc, f"cancelled order {reference} (session {session_id})")
    except gateway.ProviderRefused as exc:  # the session is gone at the provider: nothing can come
        log.info("sweep: session %s of cancelled order %s is gone (%s); no longer watched", session_id, reference, exc)
        order_store.note(order_id, order_store.Note.STOP_WATCHING)
        session.commit()
        return P.WATCH_CLOSED
    if view.payment_status == gateway.SessionPaymentStatus.PAID:
        applied = payments.apply_session(view, source="sweep", now=now)
        backoff_provider_checks(order_id, Backoff.WATCHING, now, since=since)  # until its refund has gone through
        if applied.outcome == payments.Outcome.REFUND_CREATED:
            log.warning("sweep: money arrived for cancelled order %s with no webhook; refund queued", reference)
            return P.LATE_REFUND
        return P.REFUND_UNDER_WAY
    if failed or view.status == gateway.SessionStatus.EXPIRED:
        order_store.note(order_id, order_store.Note.STOP_WATCHING)
        session.commit()
        return P.WATCH_CLOSED
    # Still payable (open) or still settling (complete, unpaid): ask again after the backoff.
    backoff_provider_checks(order_id, Backoff.WATCHING, now, since=since)
    return P.AWAITING_ASYNC


def _follow_refunds(
    order_id: int, reference: str, open_refunds: list, since: datetime, now: datetime
) -> ProviderOutcome:
    """The late money is in and has a refund: no need to ask about the session any more, only
    whether the money went back. All refunds succeeded (or were settled outside the shop by an
    operator) -> the watch ends. A refund the provider holds as pending is asked about
    (`GET /v1/refunds/{id}`) and its answer applied as its webhook's would be, so a lost
    `refund.failed` still reaches an operator and the customer. A refund command that
    died of anything but the provider's refusal (an outage dead-lettered before waiting for the
    provider existed, a bug since fixed) runs again with a fresh budget; a refused one stays a
    dead letter for an operator, and the order stays watched either way."""
    session = db.session
    open_refund_ids = [r.id for r in open_refunds]
    if not open_refund_ids:
        order_store.note(order_id, order_store.Note.STOP_WATCHING)
        session.commit()
        log.info("sweep: the late money of cancelled order %s is refunded; no longer watched", reference)
        return P.WATCH_CLOSED
    commands = session.execute(
        select(
            ScheduledCommand.id, ScheduledCommand.status, ScheduledCommand.failure_kind, ScheduledCommand.payload
        ).where(ScheduledCommand.order_id == order_id, ScheduledCommand.kind == CommandKind.REFUND_PAYMENT)
    ).all()
    session.rollback()
    dead = [
        c for c in commands if c.status == WorkStatus.DEAD and (c.payload or {}).get("refund_id") in open_refund_ids
    ]
    outcome = _ask_about_pending_refunds(reference, open_refunds, now)
    if outcome in NOT_ASKED:
        return outcome
    if not session.execute(select(Order.late_money_watch_since).where(Order.id == order_id)).scalar():
        session.rollback()
        return outcome  # the last refund went through: its success ended the watch
    session.rollback()
    for command in dead:
        if command.failure_kind == FAILURE_REFUSED:
            log.warning(
                "sweep: the refund for cancelled order %s was refused by the provider (cmd-%s); it waits "
                "for an operator in the dead letters",
                reference,
                command.id,
            )
            outcome = P.REFUND_REFUSED
            continue
        if dispatch.retry_dead("command", command.id, now):
            log.warning(
                "sweep: the refund for cancelled order %s was dead (cmd-%s); running it again", reference, command.id
            )
            outcome = P.REFUND_RETRIED if outcome is not P.REFUND_REFUSED else outcome
    backoff_provider_checks(order_id, Backoff.WATCHING, now, since=since)
    return outcome


def _ask_about_pending_refunds(reference: str, open_refunds: list, now: datetime) -> ProviderOutcome:
    """What the provider says now about each refund it holds as pending, applied (payments.refunds);
    the cycle's count for the order: refund_failed, refund_succeeded, refund_under_way, or
    unavailable or held_back when the provider could not be asked (cycle.not_answered)."""
    outcome = P.REFUND_UNDER_WAY
    for refund in open_refunds:
        if refund.status != WorkStatus.PENDING or not refund.provider_refund_id:
            continue
        try:
            view = gateway.retrieve_refund(refund.provider_refund_id)
        except gateway.ProviderUnavailable as exc:
            return not_answered(exc, f"refund {refund.id} of cancelled order {reference}")
        except gateway.ProviderRefused as exc:
            log.warning(
                "sweep: the provider refused to say how refund %s (%s) of cancelled order %s stands: %s",
                refund.id,
                refund.provider_refund_id,
                reference,
                exc,
            )
            continue
        report = apply_refund_report(view, source="sweep", now=now)
        if report.outcome in (ReportOutcome.REFUND_FAILED, ReportOutcome.REFUND_CANCELED):
            log.warning(
                "sweep: refund %s of cancelled order %s did not go through at the provider; it waits for an operator",
                refund.id,
                reference,
            )
            outcome = P.REFUND_FAILED
        elif report.outcome == ReportOutcome.REFUND_SUCCEEDED and outcome is not P.REFUND_FAILED:
            outcome = P.REFUND_SUCCEEDED
    return outcome
