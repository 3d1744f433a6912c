"""The console's lists, read straight from the tables (the database is the truth), one page at a
time: orders, operator actions, refunds, the outbox, restore warnings, webhook receipts, sweep
cycles. Each returns plain dicts (rows.py shapes each row): the JSON answer, and what the HTML page
renders. The dashboard's numbers are overview.py's, one order's history timeline.py's."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, func, or_, select, union_all
from sqlalchemy.orm import defer

from ..domain.deadlines import FAILURE_PROVIDER
from ..domain.order import LIVE_STATUSES
from ..extensions import db
from ..models import (
    WorkStatus,
    OperatorAction,
    Order,
    ReceiptOutcome,
    OutboxDelivery,
    OutboxEvent,
    ReconciliationCycle,
    Refund,
    RestoreWarning,
    ScheduledCommand,
    WebhookReceipt,
)
from ..payments import unknown_money
from ..scheduling.stuck import stuck_cutoff
from .audit import action_json
from .rows import (
    REFUND_NEEDS_OPERATOR,
    WAITING,
    command_item,
    command_json,
    delivery_detail,
    order_row,
    receipt_json,
    refund_json,
    sweep_json,
    sweep_problems,
    warning_detail,
)

PER_PAGE = 100
# obsolete: a deadline retired because its order reached a final state first (scheduled commands only).
WORK_STATUSES = ("pending", "processing", "done", "dead", "discarded", "obsolete")
# The outbox list's filters: the statuses, plus the pending rows that are waiting for an
# unavailable provider (rows.WAITING).
WORK_FILTERS = WORK_STATUSES + (WAITING,)
WARNING_STATES = ("open", "resolved", "duplicate")
WEBHOOK_OUTCOMES = tuple(ReceiptOutcome)


# A list counts its rows up to this many past the current page: exact below it, "10,000+" above. An exact
# COUNT(*) of an unfiltered list reads every row (slow at a million orders: bench/console.py) for a
# number nobody pages through.
COUNT_CAP = 10_000


def paging(query, page: int, per_page: int = PER_PAGE, count_query=None):
    """(rows, meta) for one page of a select; `page` counts from 1. `total` is exact unless
    `total_capped`, when there are at least that many (and a next page whenever there is one).
    `count_query` counts the rows when `query` only holds enough of them for this page."""
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


def orders(now: datetime, *, stuck: bool, statuses: list[str], page: int, q: str = "") -> dict:
    """Newest first (new orders on the first page); with `stuck`, the longest waiting first.
    `q` finds an order by its reference, its customer's email (any case) or its provider
    session id: each an exact match on an index, so a search costs the same at a million orders."""
    cutoff = stuck_cutoff(now)
    query = select(Order)
    if statuses:
        query = query.where(Order.status.in_(statuses))
    if q:
        query = query.where(
            or_(Order.reference == q.upper(), func.lower(Order.email) == q.lower(), Order.payment_session_id == q)
        )
    if stuck:
        counted = query.where(Order.status.in_(LIVE_STATUSES), Order.updated_at < cutoff)
        wanted = [s for s in LIVE_STATUSES if not statuses or s in statuses]
        if wanted:
            rows, meta = paging(_longest_waiting(query, wanted, cutoff, page * PER_PAGE), page, count_query=counted)
        else:  # only final states asked for: none of them is ever stuck
            rows, meta = paging(counted.order_by(Order.id), page)
    else:
        rows, meta = paging(query.order_by(Order.id.desc()), page)
    return {
        "orders": [order_row(o, now, cutoff) for (o,) in rows],
        "filters": {"stuck": stuck, "status": statuses, "q": q},
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


def audit(*, page: int, operator: str = "", order: Order | None = None) -> dict:
    """Operator actions, newest first."""
    query = select(OperatorAction, Order.reference).outerjoin(Order, Order.id == OperatorAction.order_id)
    if operator:
        query = query.where(func.lower(OperatorAction.operator) == operator.lower())
    if order is not None:
        query = query.where(OperatorAction.order_id == order.id)
    query = query.order_by(OperatorAction.id.desc())
    rows, meta = paging(query, page)
    return {"actions": [action_json(a, ref) for a, ref in rows], "filters": {"operator": operator}, **meta}


REFUND_FILTERS = ("failed", "pending", "succeeded", "settled")


def refunds(now: datetime, *, status: str | None, page: int) -> dict:
    """Refunds, oldest first; `failed`: those whose money did not go back and that no operator
    has settled (what the dashboard counts), `settled`: those an operator settled outside the shop."""
    query = select(Refund, Order.reference).join(Order, Order.id == Refund.order_id).order_by(Refund.id)
    if status == "failed":
        query = query.where(*REFUND_NEEDS_OPERATOR)
    elif status == "settled":
        query = query.where(Refund.settled_at.is_not(None))
    elif status:
        query = query.where(Refund.status == status, Refund.settled_at.is_(None))
    rows, meta = paging(query, page)
    return {
        "status": status,
        "refunds": [refund_json(r, ref, now) for r, ref in rows],
        **meta,
        "unknown_payments": [unknown_payment_json(u) for u in unknown_money.recent()],
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
        "needs_operator": row.status in ("refund_failed", "not_ours"),
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "updated_at": row.updated_at.isoformat() if row.updated_at else None,
    }


def outbox(now: datetime, *, status: str | None, page: int, keep: tuple[str, int] | None = None):
    """Deliveries and scheduled commands, oldest first, each paged on its own. The JSON lists
    both under "deliveries" in one item shape (docs/REFERENCE.md, Console): a dead refund or email is as much a
    dead letter for the operator as a dead delivery. `keep` ("delivery" | "command", id): the row an
    operator just acted on, shown first with its current state whether or not it matches the filter,
    so a retried or discarded row does not vanish from under the operator; JSON `kept`."""
    query = (
        select(OutboxDelivery, OutboxEvent.name, Order.reference)
        .join(OutboxEvent, OutboxEvent.id == OutboxDelivery.event_id)
        .outerjoin(Order, Order.id == OutboxDelivery.order_id)
        .order_by(OutboxDelivery.id)
    )
    # Oldest first by id, the order rows are written in: created_at has no index, and sorting
    # a million deliveries by it for the unfiltered first page took seconds (bench/console.py).
    cquery = (
        select(ScheduledCommand, Order.reference)
        .outerjoin(Order, Order.id == ScheduledCommand.order_id)
        .order_by(ScheduledCommand.id)
    )
    if status == WAITING:
        query = query.where(
            OutboxDelivery.status == WorkStatus.PENDING, OutboxDelivery.failure_kind == FAILURE_PROVIDER
        )
        cquery = cquery.where(
            ScheduledCommand.status == WorkStatus.PENDING, ScheduledCommand.failure_kind == FAILURE_PROVIDER
        )
    elif status:
        query = query.where(OutboxDelivery.status == status)
        cquery = cquery.where(ScheduledCommand.status == status)
    rows, meta = paging(query, page)
    crows, cmeta = paging(cquery, page)
    details = [delivery_detail(d, name, ref, now) for d, name, ref in rows]
    commands = [command_json(c, ref, now) for c, ref in crows]
    keys = ("id", "event", "handler", "status", "attempts", "last_error", "order_reference", "waiting_for_provider")
    data = {
        "status": status,
        "deliveries": [{k: d[k] for k in keys} for d in details] + [command_item(c, ref) for c, ref in crows],
        "deliveries_page": meta,
        "commands_page": cmeta,
        "kept": None,
    }
    if keep is not None:
        kind, work_id = keep
        if kind == "delivery":
            row = db.session.execute(_one_delivery(work_id)).first()
            if row is not None:
                kept = {**delivery_detail(row[0], row[1], row[2], now), "kept": True}
                details = [kept] + [d for d in details if d["id"] != work_id]
                data["kept"] = {k: kept[k] for k in keys}
        else:
            row = db.session.execute(
                select(ScheduledCommand, Order.reference)
                .outerjoin(Order, Order.id == ScheduledCommand.order_id)
                .where(ScheduledCommand.id == work_id)
            ).first()
            if row is not None:
                kept = {**command_json(row[0], row[1], now), "kept": True}
                commands = [kept] + [c for c in commands if c["id"] != work_id]
                data["kept"] = command_item(row[0], row[1])
    return data, details, commands


def _one_delivery(work_id: int):
    return (
        select(OutboxDelivery, OutboxEvent.name, Order.reference)
        .join(OutboxEvent, OutboxEvent.id == OutboxDelivery.event_id)
        .outerjoin(Order, Order.id == OutboxDelivery.order_id)
        .where(OutboxDelivery.id == work_id)
    )


def dead_groups() -> list[dict]:
    """Dead letters by handler / command kind, most first: what the 'retry all' buttons offer."""
    groups = [
        {"kind": "delivery", "name": name, "count": n}
        for name, n in db.session.execute(
            select(OutboxDelivery.handler, func.count())
            .where(OutboxDelivery.status == WorkStatus.DEAD)
            .group_by(OutboxDelivery.handler)
        ).all()
    ]
    groups += [
        {"kind": "command", "name": name, "count": n}
        for name, n in db.session.execute(
            select(ScheduledCommand.kind, func.count())
            .where(ScheduledCommand.status == WorkStatus.DEAD)
            .group_by(ScheduledCommand.kind)
        ).all()
    ]
    return sorted(groups, key=lambda g: (-g["count"], g["kind"], g["name"]))


def restore_warnings(now: datetime, *, state: str | None, page: int):
    query = (
        select(RestoreWarning, Order.reference)
        .outerjoin(Order, Order.id == RestoreWarning.order_id)
        .order_by(RestoreWarning.created_at, RestoreWarning.id)
    )
    if state:
        query = query.where(RestoreWarning.state == state)
    rows, meta = paging(query, page)
    details = [warning_detail(w, ref, now) for w, ref in rows]
    keys = ("id", "order_reference", "variant_id", "quantity", "reason", "state")
    return {"state": state, "warnings": [{k: d[k] for k in keys} for d in details], **meta}, details


def webhooks(*, outcome: str | None, page: int, signed: bool | None = None) -> dict:
    """`signed`: False keeps the noise (not signed with the shop's secret), True the provider's."""
    query = (
        select(WebhookReceipt, Order.reference)
        .outerjoin(Order, Order.id == WebhookReceipt.order_id)
        .options(defer(WebhookReceipt.body))  # up to a megabyte each: only the detail page reads it
        .order_by(WebhookReceipt.received_at.desc(), WebhookReceipt.id.desc())
    )
    if outcome:
        query = query.where(WebhookReceipt.outcome == outcome)
    if signed is not None:
        query = query.where(WebhookReceipt.signed.is_(signed))
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
        "counts": counts,
        "counts_capped": capped,
        "webhooks": [receipt_json(r, ref) for r, ref in rows],
        **meta,
    }


# How many cycles past the page are read to tell for how long an error has repeated.
REPEAT_LOOKBACK = 100


def sweeps(now: datetime, *, page: int) -> dict:
    order = (ReconciliationCycle.started_at.desc(), ReconciliationCycle.id.desc())
    query = select(ReconciliationCycle).order_by(*order)
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
                .order_by(*order)
                .limit(REPEAT_LOOKBACK)
            )
            .scalars()
            .all()
        )
    problems = sweep_problems(history, now)
    return {"cycles": [sweep_json(c, now, problems.get(c.id, [])) for c in cycles], **meta}
