"""The console's lists, read straight from the tables (the database is the truth), one page at a
time: orders, operator actions, refunds, restore warnings, webhook receipts, sweep cycles (the
outbox's is outbox_queries.py's). Each returns plain dicts (rows.py shapes each row): the JSON
answer, and what the HTML page renders. The dashboard's numbers are overview.py's, one order's
history timeline.py's."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select, union_all
from sqlalchemy.orm import defer

from ..domain.order import LIVE_STATUSES
from ..extensions import db
from ..models import (
    OperatorAction,
    Order,
    ReceiptOutcome,
    ReconciliationCycle,
    Refund,
    RestoreWarning,
    UnknownPaymentStatus,
    WebhookReceipt,
)
from ..payments import unknown_money
from ..scheduling.past_cycles import NEWEST_FIRST
from ..scheduling.stuck import stuck_cutoff
from .audit import action_json
from .rows import (
    REFUND_NEEDS_OPERATOR,
    order_row,
    receipt_json,
    refund_json,
    refunded_by_order,
    sweep_json,
    sweep_problems,
    warning_detail,
)
from .search import Filters, contains, in_amount_range, in_date_range

PER_PAGE = 100
NO_FILTERS = Filters()
WARNING_STATES = ("open", "resolved", "duplicate")
WEBHOOK_OUTCOMES = tuple(ReceiptOutcome)


# A list counts its rows up to this many past the current page: exact below it, "10,000+" above. An exact
# COUNT(*) of an unfiltered list reads every row (slow at a million orders: bench/console.py) for a
# number nobody pages through.
COUNT_CAP = 10_000


def paging(query, page: int, per_page: int | None = None, count_query=None) -> tuple[Sequence[Any], dict]:
    """(rows, meta) for one page of a select; `page` counts from 1. `total` is exact unless
    `total_capped`, when there are at least that many (and a next page whenever there is one).
    `count_query` counts the rows when `query` only holds enough of them for this page."""
    per_page = per_page or PER_PAGE
    limit = page * per_page + COUNT_CAP
    counted = db.session.execute(
        select(func.count()).select_from(
            (count_query if count_query is not None else query).order_by(None).limit(limit + 1).subquery()
        )
    ).scalar_one()
    rows = db.session.execute(query.limit(per_page).offset((page - 1) * per_page)).all()
    meta = {
        "page": page,
        "per_page": per_page,
        "total": min(counted, limit),
        "total_capped": counted > limit,
        "next_page": page + 1 if page * per_page < counted else None,
    }
    return rows, meta


def order_conditions(now: datetime, *, stuck: bool, statuses: list[str], filters: Filters = NO_FILTERS) -> list:
    """The WHERE of the orders list and of its CSV. `q` matches part of the reference or of the
    customer's email (any case), or the whole provider session id; the amount is the order's
    total; the dates are when it was placed (created_at)."""
    conditions = []
    if statuses:
        conditions.append(Order.status.in_(statuses))
    if filters.q:
        conditions.append(_order_text(filters.q))
    conditions += in_date_range(Order.created_at, filters)
    conditions += in_amount_range(Order.total, Order.currency, filters)
    if stuck:
        conditions += [Order.status.in_(LIVE_STATUSES), Order.updated_at < stuck_cutoff(now)]
    return conditions


# What an operator pastes whole: a reference, an email address, a provider session id. Each is
# looked up along its own index (orders.reference, ix_orders_email_lower, the session id's), so the
# search bench/console.py times stays an index lookup at a million orders. Anything else is a part
# of a reference or an email, which no b-tree index can find: the list reads orders newest first
# until its page is full (and counts matches up to COUNT_CAP).
WHOLE_REFERENCE = re.compile(r"BK-[A-Z0-9]{8}", re.IGNORECASE)
WHOLE_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def _order_text(q: str):
    if WHOLE_REFERENCE.fullmatch(q):
        return Order.reference == q.upper()
    if WHOLE_EMAIL.fullmatch(q):
        return func.lower(Order.email) == q.lower()
    if q.startswith("cs_"):
        return Order.payment_session_id == q
    return or_(contains(Order.reference, q, upper=True), contains(Order.email, q), Order.payment_session_id == q)


def orders(now: datetime, *, stuck: bool, statuses: list[str], page: int, filters: Filters = NO_FILTERS) -> dict:
    """Newest first (new orders on the first page); with `stuck`, the longest waiting first.
    An exact reference, email or session id is found along an index; a part of one (and the
    amount and date filters) reads the orders newest first until a page is full, which at a
    million orders is a scan when nothing matches (bench/console.py)."""
    cutoff = stuck_cutoff(now)
    query = select(Order).where(*order_conditions(now, stuck=False, statuses=statuses, filters=filters))
    if stuck:
        counted = query.where(Order.status.in_(LIVE_STATUSES), Order.updated_at < cutoff)
        wanted = [s for s in LIVE_STATUSES if not statuses or s in statuses]
        if wanted:
            rows, meta = paging(_longest_waiting(query, wanted, cutoff, page * PER_PAGE), page, count_query=counted)
        else:  # only final states asked for: none of them is ever stuck
            rows, meta = paging(counted.order_by(Order.id), page)
    else:
        rows, meta = paging(query.order_by(Order.id.desc()), page)
    refunded = refunded_by_order([o.id for (o,) in rows])
    return {
        "orders": [order_row(o, now, cutoff, refunded.get(o.id, 0)) for (o,) in rows],
        "filters": {"stuck": stuck, "status": statuses, **filters.as_json()},
        **meta,
    }


def _longest_waiting(query, statuses, cutoff: datetime, n: int):
    """The first `n` stuck orders, longest waiting first, as one range scan of
    ix_orders_status_updated_at per status merged (as the sweep selects): over an IN list
    PostgreSQL fetched and sorted every stuck row, in parallel workers, for each page."""
    parts = []
    for status in statuses:
        inner = (
            query.with_only_columns(Order.id, Order.updated_at)
            .where(Order.status == status, Order.updated_at < cutoff)
            .order_by(Order.updated_at, Order.id)
            .limit(n)
            .subquery()
        )
        parts.append(select(inner.c.id, inner.c.updated_at))
    first = union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()
    return select(Order).join(first, first.c.id == Order.id).order_by(first.c.updated_at, first.c.id)


def audit_conditions(operator: str = "", filters: Filters = NO_FILTERS) -> list:
    """The WHERE of the audit trail and of its CSV (the query joins the action's order): one
    operator's (any case), `q` part of the operator, the action, its target or the order's
    reference, the dates when it was done."""
    conditions = []
    if operator:
        conditions.append(func.lower(OperatorAction.operator) == operator.lower())
    if filters.q:
        conditions.append(
            or_(
                contains(OperatorAction.operator, filters.q),
                contains(OperatorAction.action, filters.q.replace(" ", "_")),
                contains(OperatorAction.target, filters.q),
                contains(Order.reference, filters.q, upper=True),
            )
        )
    return conditions + in_date_range(OperatorAction.created_at, filters)


def audit(*, page: int, operator: str = "", order: Order | None = None, filters: Filters = NO_FILTERS) -> dict:
    """Operator actions, newest first."""
    query = select(OperatorAction, Order.reference).outerjoin(Order, Order.id == OperatorAction.order_id)
    query = query.where(*audit_conditions(operator, filters))
    if order is not None:
        query = query.where(OperatorAction.order_id == order.id)
    query = query.order_by(OperatorAction.id.desc())
    rows, meta = paging(query, page)
    return {
        "actions": [action_json(a, ref) for a, ref in rows],
        "filters": {"operator": operator, **filters.as_json()},
        **meta,
    }


REFUND_FILTERS = ("failed", "pending", "succeeded", "settled")


def refund_conditions(status: str | None, filters: Filters = NO_FILTERS) -> list:
    """The WHERE of the refunds list and of its CSV (the query joins the refund's order): `q` is part
    of the order's reference or the provider's refund id, the amount the refund's, the dates when
    it was created."""
    conditions = []
    if status == "failed":
        conditions += REFUND_NEEDS_OPERATOR
    elif status == "settled":
        conditions.append(Refund.settled_at.is_not(None))
    elif status:
        conditions += [Refund.status == status, Refund.settled_at.is_(None)]
    if filters.q:
        conditions.append(or_(contains(Order.reference, filters.q, upper=True), Refund.provider_refund_id == filters.q))
    conditions += in_date_range(Refund.created_at, filters)
    conditions += in_amount_range(Refund.amount, Refund.currency, filters)
    return conditions


def refunds(now: datetime, *, status: str | None, page: int, filters: Filters = NO_FILTERS) -> dict:
    """Refunds, oldest first; `failed`: those whose money did not go back and that no operator
    has settled (what the dashboard counts), `settled`: those an operator settled outside the shop."""
    query = (
        select(Refund, Order.reference)
        .join(Order, Order.id == Refund.order_id)
        .where(*refund_conditions(status, filters))
        .order_by(Refund.id)
    )
    rows, meta = paging(query, page)
    return {
        "status": status,
        "filters": filters.as_json(),
        "refunds": [refund_json(r, ref, now) for r, ref in rows],
        **meta,
        "unknown_payments": [unknown_payment_json(u) for u in unknown_money.recent()],
        "unknown_payments_total": unknown_money.count(),
    }


def unknown_payment_json(row) -> dict:
    """Money the provider took for a session naming no order this database knows (docs/REFERENCE.md, Console)."""
    return {
        "id": row.id,
        "session_id": row.session_id,
        "reference": row.reference,
        "amount": row.amount,
        "currency": row.currency,
        "status": row.status,
        "found_via": row.found_via,
        "provider_refund_id": row.provider_refund_id,
        "detail": row.detail,
        "needs_operator": row.status in (UnknownPaymentStatus.REFUND_FAILED, UnknownPaymentStatus.NOT_OURS),
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "updated_at": row.updated_at.isoformat() if row.updated_at else None,
    }


WARNING_KEYS = ("id", "order_reference", "variant_id", "quantity", "reason", "state")


def warning_conditions(state: str | None, filters: Filters = NO_FILTERS) -> list:
    """The WHERE of the restore warnings and of their CSV (the query joins the warning's order): `q`
    is part of the order's reference or of the reason, or a variant's id; the dates when the
    warning was raised."""
    conditions = [RestoreWarning.state == state] if state else []
    if filters.q:
        found = [contains(Order.reference, filters.q, upper=True), contains(RestoreWarning.reason, filters.q)]
        if filters.q.isdigit() and len(filters.q) < 10:
            found.append(RestoreWarning.variant_id == int(filters.q))
        conditions.append(or_(*found))
    return conditions + in_date_range(RestoreWarning.created_at, filters)


def restore_warnings(now: datetime, *, state: str | None, page: int, filters: Filters = NO_FILTERS):
    query = (
        select(RestoreWarning, Order.reference)
        .outerjoin(Order, Order.id == RestoreWarning.order_id)
        .where(*warning_conditions(state, filters))
        .order_by(RestoreWarning.created_at, RestoreWarning.id)
    )
    rows, meta = paging(query, page)
    details = [warning_detail(w, ref, now) for w, ref in rows]
    return (
        {
            "state": state,
            "warnings": [{k: d[k] for k in WARNING_KEYS} for d in details],
            "filters": filters.as_json(),
            **meta,
        },
        details,
    )


def webhook_conditions(outcome: str | None, filters: Filters = NO_FILTERS, signed: bool | None = None) -> list:
    """The WHERE of the webhooks list and of its CSV: `q` is part of the order's reference or of the
    event's type, or the whole event id; the dates when the delivery was received; `signed`: False
    keeps the noise (not signed with the shop's secret), True the provider's."""
    conditions = [WebhookReceipt.outcome == outcome] if outcome else []
    if signed is not None:
        conditions.append(WebhookReceipt.signed.is_(signed))
    if filters.q:
        conditions.append(
            or_(
                contains(Order.reference, filters.q, upper=True),
                contains(WebhookReceipt.event_type, filters.q),
                WebhookReceipt.event_id == filters.q,
            )
        )
    return conditions + in_date_range(WebhookReceipt.received_at, filters)


def webhooks(*, outcome: str | None, page: int, filters: Filters = NO_FILTERS, signed: bool | None = None) -> dict:
    """Newest first. `counts` are of every receipt by outcome, whatever the other filters."""
    query = (
        select(WebhookReceipt, Order.reference)
        .outerjoin(Order, Order.id == WebhookReceipt.order_id)
        .where(*webhook_conditions(outcome, filters, signed))
        .options(defer(WebhookReceipt.body))  # up to a megabyte each: only the detail page reads it
        .order_by(WebhookReceipt.received_at.desc(), WebhookReceipt.id.desc())
    )
    rows, meta = paging(query, page)
    # Each outcome counted up to COUNT_CAP + 1 along ix_webhook_receipts_outcome_received_at: a
    # GROUP BY over every receipt ever (about two per paid order) read the whole table on each refresh.
    counts, capped = {}, []
    for name in WEBHOOK_OUTCOMES:
        n = db.session.execute(
            select(func.count()).select_from(
                select(WebhookReceipt.outcome).where(WebhookReceipt.outcome == name).limit(COUNT_CAP + 1).subquery()
            )
        ).scalar_one()
        if n:
            counts[name] = min(n, COUNT_CAP)
        if n > COUNT_CAP:
            capped.append(name)
    return {
        "outcome": outcome,
        "signed": signed,
        "filters": filters.as_json(),
        "counts": counts,
        "counts_capped": capped,
        "webhooks": [receipt_json(r, ref) for r, ref in rows],
        **meta,
    }


# How many cycles past the page are read to tell for how long an error has repeated.
REPEAT_LOOKBACK = 100


def sweeps(now: datetime, *, page: int) -> dict:
    query = select(ReconciliationCycle).order_by(*NEWEST_FIRST)
    rows, meta = paging(query, page, per_page=50)
    cycles = [c for (c,) in rows]
    history = list(cycles)
    if cycles:  # the cycles just past the page, only to count how long an error has repeated
        last = cycles[-1]
        history += (
            db.session.execute(
                select(ReconciliationCycle)
                .where(
                    or_(
                        ReconciliationCycle.started_at < last.started_at,
                        and_(ReconciliationCycle.started_at == last.started_at, ReconciliationCycle.id < last.id),
                    )
                )
                .order_by(*NEWEST_FIRST)
                .limit(REPEAT_LOOKBACK)
            )
            .scalars()
            .all()
        )
    problems = sweep_problems(history, now)
    return {"cycles": [sweep_json(c, now, problems.get(c.id, [])) for c in cycles], **meta}
