"""Writing events and commands inside the caller's transaction (Core inserts: checkout is hot)."""
from __future__ import annotations

from datetime import datetime

from flask import current_app
from sqlalchemy import insert

from ..domain.deadlines import utcnow
from ..models import OutboxDelivery, OutboxEvent, ScheduledCommand
from .subscriptions import SUBSCRIPTIONS


# Built once: constructing a Core statement costs more than executing its cached compiled form,
# and these run in every transition (measured: ~30% of a webhook delivery's writer time).
_INSERT_EVENT = insert(OutboxEvent).returning(OutboxEvent.id)
_INSERT_DELIVERY = insert(OutboxDelivery).returning(OutboxDelivery.id)
_INSERT_COMMAND = insert(ScheduledCommand).returning(ScheduledCommand.id)


def after_commit(session) -> dict:
    """What to tell Redis once this session's transaction has committed."""
    return session.info.setdefault("after_commit", {"deliveries": [], "commands": []})


def write_events(session, events, now: datetime | None = None) -> list[int]:
    """Insert each event and one pending delivery per subscribed handler. Returns delivery ids."""
    if not events:
        return []
    now = now or utcnow()
    max_attempts = current_app.config["OUTBOX_MAX_ATTEMPTS"]
    delivery_ids: list[int] = []
    for event in events:
        event_id = session.execute(
            _INSERT_EVENT, dict(order_id=event.order_id, name=event.name, payload=event.payload(), created_at=now)
        ).scalar_one()
        for handler in SUBSCRIPTIONS.get(event.name, []):
            delivery_ids.append(session.execute(_INSERT_DELIVERY, dict(
                event_id=event_id, handler=handler, order_id=event.order_id, status="pending", attempts=0,
                max_attempts=max_attempts, next_attempt_at=now, enqueued_at=now, created_at=now, updated_at=now,
            )).scalar_one())
    after_commit(session)["deliveries"].extend(delivery_ids)
    return delivery_ids


def schedule_command(session, kind: str, due_at: datetime, *, order_id: int | None = None,
                     payload: dict | None = None, now: datetime | None = None) -> int:
    now = now or utcnow()
    command_id = session.execute(_INSERT_COMMAND, dict(
        kind=kind, order_id=order_id, payload=payload or {}, status="pending", attempts=0,
        max_attempts=current_app.config["OUTBOX_MAX_ATTEMPTS"], next_attempt_at=due_at,
        enqueued_at=now, created_at=now, updated_at=now,
    )).scalar_one()
    after_commit(session)["commands"].append((command_id, due_at))
    return command_id
