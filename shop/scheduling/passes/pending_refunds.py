"""The follow-up of pending refunds no watch follows: an operator's refund of a paid order, and the
refund of a second payment of a paid order. The late money of a cancelled order is followed by
that order's watch (late_money.py); these had only their webhooks, so a lost `refund.failed`
left a refund pending for ever, the customer unpaid and no operator told.

Each cycle asks the provider (`GET /v1/refunds/{id}`) about the pending refunds it has heard
nothing of for a while, oldest news first, and applies the answer as its webhook's would be
(payments.refunds.apply_refund_report): a failure reaches the customer and the dashboard. The
wait before asking grows with the refund's age (a card refund settles in days), from a sweep
interval up to an hour; each question counts as news, so one refund is asked about at most that
often."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import select, update

from ... import logs
from ...domain.deadlines import as_utc
from ...domain.refunds import RefundStatus
from ...extensions import db
from ...models import Order, Refund
from ...outbox import uow
from ...payments.refunds import ReportOutcome, apply_refund_report
from ...provider import gateway
from ..cycle import NOT_ASKED, PassName, ProviderOutcome, Tally, error_kind, not_answered
from ..lease import LeaseLost

log = logging.getLogger("shop.sweep")
P = ProviderOutcome

LONGEST_WAIT = timedelta(hours=1)
PER_CYCLE = 50


def follow_pending_refunds(counts: dict, errors: list, keep_lease, clock) -> None:
    """Ask about each due refund in turn; one's failure never stops the next (as the order passes)."""
    unavailable = 0
    for row in unwatched_pending_refunds(clock()):
        if not keep_lease():
            raise LeaseLost(f"the sweep lease lapsed or was taken over before refund {row.id}")
        if unavailable >= 3:
            return  # the provider is away: the rest wait for the next cycle
        with logs.scope(order_ref=row.reference):
            try:
                outcome = follow_pending_refund(row, clock())
            except Exception as exc:
                uow.rollback(db.session)
                log.exception("sweep: following refund %s failed; continuing with the next", row.id)
                counts[Tally.ERRORS] = counts.get(Tally.ERRORS, 0) + 1
                errors.append(
                    {
                        "pass": PassName.PROVIDER,
                        "order_id": None,
                        "reference": row.reference,
                        "kind": error_kind(exc),
                        "error": f"refund {row.id}: {type(exc).__name__}: {exc}"[:500],
                    }
                )
                continue
        counts[outcome] = counts.get(outcome, 0) + 1
        unavailable = unavailable + 1 if outcome in NOT_ASKED else 0


def unwatched_pending_refunds(now: datetime, limit: int = PER_CYCLE) -> list:
    """(id, provider id, order reference, created_at, updated_at) of pending refunds, held at the
    provider, of orders no late-money watch follows, heard of at least a sweep interval ago."""
    interval = timedelta(seconds=current_app.config["RECONCILIATION_INTERVAL_SECONDS"])
    rows = db.session.execute(
        select(Refund.id, Refund.provider_refund_id, Order.reference, Refund.created_at, Refund.updated_at)
        .join(Order, Order.id == Refund.order_id)
        .where(
            Refund.status == RefundStatus.PENDING,
            Refund.provider_refund_id.is_not(None),
            Refund.settled_at.is_(None),
            Refund.updated_at <= now - interval,
            Order.late_money_watch_since.is_(None),
        )
        .order_by(Refund.updated_at)
        .limit(limit * 4)
    ).all()
    db.session.rollback()
    due = [r for r in rows if now - as_utc(r.updated_at) >= _wait(now, r, interval)]
    return due[:limit]


def _wait(now: datetime, row, interval: timedelta) -> timedelta:
    """A quarter of the refund's age, between one sweep interval and an hour."""
    return min(LONGEST_WAIT, max(interval, (now - as_utc(row.created_at)) / 4))


def follow_pending_refund(row, now: datetime) -> ProviderOutcome:
    try:
        view = gateway.retrieve_refund(row.provider_refund_id)
    except gateway.ProviderUnavailable as exc:
        return not_answered(exc, f"refund {row.id} of order {row.reference}")
    except gateway.ProviderRefused as exc:
        log.warning("sweep: the provider would not say how refund %s of %s stands: %s", row.id, row.reference, exc)
        _heard(row.id, now)
        return P.CHANGED
    report = apply_refund_report(view, source="sweep", now=now)
    if report.outcome in (ReportOutcome.REFUND_FAILED, ReportOutcome.REFUND_CANCELED):
        log.warning("sweep: refund %s of order %s did not go through; it waits for an operator", row.id, row.reference)
        return P.REFUND_FAILED
    if report.outcome == ReportOutcome.REFUND_SUCCEEDED:
        return P.REFUND_SUCCEEDED
    _heard(row.id, now)
    return P.REFUND_UNDER_WAY


def _heard(refund_id: int, now: datetime) -> None:
    """Still pending: its `updated_at` says when the shop last heard of it, so the next question waits."""
    db.session.execute(
        update(Refund).where(Refund.id == refund_id, Refund.status == RefundStatus.PENDING).values(updated_at=now)
    )
    db.session.commit()
