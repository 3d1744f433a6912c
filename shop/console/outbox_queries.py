"""The console's outbox list (docs/REFERENCE.md, Console): deliveries and scheduled commands, each
paged on its own and filtered by status (or waiting for the provider), the row an operator just
acted on kept in view, and the dead letters grouped for the 'retry all' buttons. The other lists are
queries.py's."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, or_, select

from ..domain.deadlines import FAILURE_PROVIDER
from ..extensions import db
from ..models import Order, OutboxDelivery, OutboxEvent, ScheduledCommand, WorkStatus
from .queries import NO_FILTERS, paging
from .rows import WAITING, command_item, command_json, delivery_detail
from .search import Filters, contains, in_date_range

# obsolete: a deadline retired because its order reached a final state first (scheduled commands only).
WORK_STATUSES = ("pending", "processing", "done", "dead", "discarded", "obsolete")
# The outbox list's filters: the statuses, plus the pending rows that are waiting for an
# unavailable provider (rows.WAITING).
WORK_FILTERS = WORK_STATUSES + (WAITING,)


def delivery_conditions(status: str | None, filters: Filters = NO_FILTERS) -> list:
    """The WHERE of the outbox's deliveries and of their CSV: `q` is part of the order's reference
    or of the handler's name, the dates when the delivery was written."""
    return _work_conditions(OutboxDelivery, OutboxDelivery.handler, status, filters)


def command_conditions(status: str | None, filters: Filters = NO_FILTERS) -> list:
    """The WHERE of the outbox's scheduled commands and of their CSV: `q` is part of the order's
    reference or of the command's kind, the dates when the command was written."""
    return _work_conditions(ScheduledCommand, ScheduledCommand.kind, status, filters)


def _work_conditions(model: type[OutboxDelivery] | type[ScheduledCommand], named, status, filters: Filters) -> list:
    """The WHERE of one kind of outbox work (`model`, its rows joined to their orders): the status
    (WAITING: pending for an unavailable provider), `q` in the order's reference or in the column
    `named`, the dates when the row was written."""
    conditions = []
    if status == WAITING:
        conditions += [model.status == WorkStatus.PENDING, model.failure_kind == FAILURE_PROVIDER]
    elif status:
        conditions.append(model.status == status)
    if filters.q:
        conditions.append(or_(contains(Order.reference, filters.q, upper=True), contains(named, filters.q)))
    return conditions + in_date_range(model.created_at, filters)


def outbox(
    now: datetime,
    *,
    status: str | None,
    page: int,
    keep: tuple[str, int] | None = None,
    filters: Filters = NO_FILTERS,
):
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
    query = query.where(*delivery_conditions(status, filters))
    cquery = cquery.where(*command_conditions(status, filters))
    rows, meta = paging(query, page)
    crows, cmeta = paging(cquery, page)
    details = [delivery_detail(d, name, ref, now) for d, name, ref in rows]
    commands = [command_json(c, ref, now) for c, ref in crows]
    keys = ("id", "event", "handler", "status", "attempts", "last_error", "order_reference", "waiting_for_provider")
    data = {
        "status": status,
        "filters": filters.as_json(),
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
    groups = _dead_by("delivery", OutboxDelivery, OutboxDelivery.handler)
    groups += _dead_by("command", ScheduledCommand, ScheduledCommand.kind)
    return sorted(groups, key=lambda g: (-g["count"], g["kind"], g["name"]))


def _dead_by(kind: str, model: type[OutboxDelivery] | type[ScheduledCommand], named) -> list[dict]:
    """One kind of outbox work's dead letters counted by the column `named`."""
    rows = db.session.execute(select(named, func.count()).where(model.status == WorkStatus.DEAD).group_by(named))
    return [{"kind": kind, "name": name, "count": n} for name, n in rows.all()]
