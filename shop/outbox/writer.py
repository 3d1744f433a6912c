"""Writing events and commands inside the caller's transaction (Core inserts: checkout is hot)."""

from __future__ import annotations

import functools
from datetime import datetime

from flask import current_app
from sqlalchemy import bindparam, insert, literal, select, union_all, update

from .. import logs, traces
from ..domain.deadlines import utcnow
from ..domain.events import EventName
from ..models import CommandKind, OutboxDelivery, OutboxEvent, ScheduledCommand, WorkStatus
from .subscriptions import SUBSCRIPTIONS
from .tables import table_of

# Built once: constructing a Core statement costs more than executing its cached compiled form,
# and these run in every transition. On the tables, not the mapped classes: an INSERT of a mapped
# class goes through the ORM's bulk-insert machinery, which cost more than the round trip itself.
_events, _deliveries, _commands = table_of(OutboxEvent), table_of(OutboxDelivery), table_of(ScheduledCommand)
_INSERT_EVENT = insert(_events).returning(_events.c.id)
_INSERT_DELIVERY = insert(_deliveries).returning(_deliveries.c.id)
_INSERT_COMMAND = insert(_commands).returning(_commands.c.id)

# An order that reached a final state has nothing left to expire: its pending deadlines are
# retired in the transaction that finished it, so they are never claimed, never run, and never
# listed as pending work. Here, because every transition's events pass through write_events (the
# unit of work's commit and the payment fast path alike), so no path to Paid/Cancelled can forget.
OBSOLETE = WorkStatus.OBSOLETE
_FINAL_EVENTS = {
    EventName.ORDER_PAID: "obsolete: the order was paid before its deadline",
    EventName.ORDER_CANCELLED: "obsolete: the order was cancelled before its deadline",
}
_RETIRE_DEADLINES = (
    update(_commands)
    .where(
        _commands.c.order_id == bindparam("order"),
        _commands.c.kind == CommandKind.EXPIRE_UNPAID_ORDER,
        _commands.c.status == WorkStatus.PENDING,
    )
    .values(
        status=OBSOLETE,
        discard_reason=bindparam("reason"),
        completed_at=bindparam("now"),
        updated_at=bindparam("now"),
        claimed_by=None,
        claimed_until=None,
    )
    .returning(_commands.c.id)
)


def after_commit(session) -> dict:
    """What to tell Redis once this session's transaction has committed."""
    return session.info.setdefault("after_commit", {"deliveries": [], "commands": []})


@functools.cache
def _insert_event_with_deliveries(handlers: tuple[str, ...]):
    """PostgreSQL: the event and its deliveries in ONE statement, the event's INSERT as a
    data-modifying CTE whose new id feeds the deliveries' INSERT ... SELECT. Same rows as the
    two-statement path, one round trip (and one statement's client CPU) fewer per event."""
    event = (
        insert(_events)
        .values(
            order_id=bindparam("order_id", type_=_events.c.order_id.type),
            name=bindparam("name", type_=_events.c.name.type),
            payload=bindparam("payload", type_=_events.c.payload.type),
            created_at=bindparam("now", type_=_events.c.created_at.type),
        )
        .returning(_events.c.id)
        .cte("new_event")
    )
    now = bindparam("now", type_=_deliveries.c.created_at.type)
    request_id = bindparam("request_id", type_=_deliveries.c.request_id.type)
    traceparent = bindparam("traceparent", type_=_deliveries.c.traceparent.type)

    def row(handler: str):
        return select(
            event.c.id,
            literal(handler, _deliveries.c.handler.type),
            bindparam("order_id", type_=_deliveries.c.order_id.type),
            literal("pending", _deliveries.c.status.type),
            literal(0),
            bindparam("max_attempts"),
            now,
            now,
            now,
            now,
            request_id,
            traceparent,
        )

    # One SELECT per handler (not a VALUES list: SQLAlchemy cannot cache a statement holding
    # one, and compiling it on every call cost four times the round trip it saves).
    rows = row(handlers[0]) if len(handlers) == 1 else union_all(*(row(h) for h in handlers))
    return (
        insert(_deliveries)
        .from_select(
            [
                "event_id",
                "handler",
                "order_id",
                "status",
                "attempts",
                "max_attempts",
                "next_attempt_at",
                "enqueued_at",
                "created_at",
                "updated_at",
                "request_id",
                "traceparent",
            ],
            rows,
        )
        .returning(_deliveries.c.id)
    )


def write_events(session, events, now: datetime | None = None) -> list[int]:
    """Insert each event and one pending delivery per subscribed handler. Returns delivery ids.
    Each delivery carries the current request id (shop.logs) and, with tracing on, the current
    span's traceparent (shop.traces), bound parameters like the others."""
    if not events:
        return []
    now = now or utcnow()
    max_attempts = current_app.config["OUTBOX_MAX_ATTEMPTS"]
    request_id, traceparent = logs.request_id(), traces.traceparent()
    delivery_ids: list[int] = []
    one_statement = session.get_bind().dialect.name == "postgresql"
    for event in events:
        handlers = tuple(SUBSCRIPTIONS.get(event.name, ()))
        if handlers and one_statement:
            delivery_ids.extend(
                session.execute(
                    _insert_event_with_deliveries(handlers),
                    dict(
                        order_id=event.order_id,
                        name=event.name,
                        payload=event.payload(),
                        now=now,
                        max_attempts=max_attempts,
                        request_id=request_id,
                        traceparent=traceparent,
                    ),
                ).scalars()
            )
            continue
        event_id = session.execute(
            _INSERT_EVENT, dict(order_id=event.order_id, name=event.name, payload=event.payload(), created_at=now)
        ).scalar_one()
        for handler in handlers:
            delivery_ids.append(
                session.execute(
                    _INSERT_DELIVERY,
                    dict(
                        event_id=event_id,
                        handler=handler,
                        order_id=event.order_id,
                        **fresh_budget(now, now),
                        created_at=now,
                        request_id=request_id,
                        traceparent=traceparent,
                    ),
                ).scalar_one()
            )
    pending = after_commit(session)
    pending["deliveries"].extend(delivery_ids)
    for event in events:
        reason = _FINAL_EVENTS.get(event.name)
        if reason and event.order_id is not None:
            retired = set(
                session.execute(_RETIRE_DEADLINES, dict(order=event.order_id, reason=reason, now=now)).scalars()
            )
            if retired:
                # Armed in this very transaction: never announce it.
                pending["commands"] = [c for c in pending["commands"] if c[0] not in retired]
    return delivery_ids


def fresh_budget(due_at: datetime, now: datetime) -> dict:
    """The columns of outbox work that is to be done (again) from scratch: pending and due at
    `due_at`, with none of its OUTBOX_MAX_ATTEMPTS spent, enqueued `now`. A new delivery or
    command is written with them, and a dead row an operator runs again is set back to them."""
    return dict(
        status=WorkStatus.PENDING,
        attempts=0,
        max_attempts=current_app.config["OUTBOX_MAX_ATTEMPTS"],
        next_attempt_at=due_at,
        enqueued_at=now,
        updated_at=now,
    )


def schedule_command(
    session,
    kind: CommandKind,
    due_at: datetime,
    *,
    order_id: int | None = None,
    payload: dict | None = None,
    now: datetime | None = None,
) -> int:
    now = now or utcnow()
    command_id = session.execute(
        _INSERT_COMMAND,
        dict(
            kind=kind,
            order_id=order_id,
            payload=payload or {},
            **fresh_budget(due_at, now),
            created_at=now,
            request_id=logs.request_id(),
            traceparent=traces.traceparent(),
        ),
    ).scalar_one()
    after_commit(session)["commands"].append((command_id, due_at))
    return command_id
