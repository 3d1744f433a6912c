"""Which orders are stuck: the cutoff (an order unchanged for RECONCILIATION_STUCK_AGE_SECONDS
is stuck), and the bounded range scans the sweep's passes select them by."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import or_, select

from ..domain.deadlines import as_utc, utcnow
from ..domain.order import OrderStatus
from ..extensions import db
from ..models import Order
from ..orders.deadline import unpaid_hold


def stuck_age() -> timedelta:
    """How long an order may sit unchanged in a live state before it counts as stuck."""
    return timedelta(seconds=current_app.config["RECONCILIATION_STUCK_AGE_SECONDS"])


def stuck_cutoff(now: datetime | None = None) -> datetime:
    """Orders last changed before this are stuck (the sweep's cutoff, the console's and the
    metrics' "stuck")."""
    return (now or utcnow()) - stuck_age()


def expiry_cutoffs(now: datetime, cutoff: datetime) -> dict[OrderStatus, datetime]:
    """The expiry pass's cutoff for each unpaid state: an order that never had a payment session
    (PendingPayment) is past its pay-by once its short hold is over
    (UNPAID_HOLD_WITHOUT_SESSION_SECONDS), before it counts as stuck; one whose payment failed
    at the stuck cutoff, which is its window. So the sweep expires an order whose deadline row
    went missing when that row would have, never earlier."""
    held = now - timedelta(seconds=unpaid_hold(OrderStatus.PENDING_PAYMENT))
    return {OrderStatus.PENDING_PAYMENT: max(cutoff, held), OrderStatus.PAYMENT_FAILED: cutoff}


def stuck_query(status, cutoff: datetime, limit: int, *, with_session: bool = False, now: datetime | None = None):
    """One status's oldest stuck orders: a range scan of ix_orders_status_updated_at that stops
    after `limit` rows. With a session (the provider pass), orders the sweep decided to leave
    alone for a while (see `backoff_provider_checks`) are skipped until their time."""
    query = (
        select(Order.updated_at, Order.id)
        .where(Order.status == OrderStatus(status), Order.updated_at < cutoff)
        .order_by(Order.updated_at, Order.id)
        .limit(limit)
    )
    if with_session:
        query = query.where(Order.payment_session_id.is_not(None))
        if now is not None:
            query = query.where(or_(Order.provider_next_check_at.is_(None), Order.provider_next_check_at <= now))
    return query


def stuck_order_ids(
    statuses,
    cutoff: datetime,
    limit: int,
    *,
    with_session: bool = False,
    now: datetime | None = None,
    cutoffs: dict | None = None,
) -> list[int]:
    """The `limit` oldest orders in `statuses` last changed before `cutoff` (or their status's
    own cutoff in `cutoffs`), as ids.

    One bounded range scan of (status, updated_at, id) per status, merged here: an IN list over
    two statuses would make PostgreSQL sort every stuck row before the LIMIT, so a large backlog
    would cost the backlog instead of the batch."""
    rows = []
    for status in statuses:
        since = cutoffs.get(OrderStatus(status), cutoff) if cutoffs else cutoff
        query = stuck_query(status, since, limit, with_session=with_session, now=now)
        rows.extend((as_utc(updated), order_id) for updated, order_id in db.session.execute(query).all())
    db.session.rollback()  # the selection holds nothing while the orders are worked
    return [order_id for _, order_id in sorted(rows)[:limit]]
