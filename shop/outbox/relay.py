"""The relay: the database tells Redis again about any work Redis may have lost.

It runs as a periodic rq-scheduler job and at scheduler start. It looks for deliveries and
commands that are due but were announced longer ago than a grace period (Redis lost them, or
the post-commit announce failed), and rows whose worker died holding the lease: commands are
enqueued again by id, deliveries by one drain job (which claims every due delivery). Rows
selected with FOR UPDATE SKIP LOCKED on PostgreSQL, so concurrent relays split the work instead
of doubling it; a duplicate announcement is harmless anyway, since a claim is needed to run.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import and_, or_, select, update

from .. import queue
from ..domain.deadlines import utcnow
from ..extensions import db
from ..models import OutboxDelivery, ScheduledCommand, WorkStatus

log = logging.getLogger("shop.outbox")


def _bury_exhausted(model, now) -> int:
    """A row whose lease lapsed with no attempts left: its worker died on the last try."""
    result = db.session.execute(
        update(model)
        .where(model.status == WorkStatus.PROCESSING, model.claimed_until < now, model.attempts >= model.max_attempts)
        .values(
            status=WorkStatus.DEAD,
            claimed_until=None,
            updated_at=now,
            last_error="worker lost while running the last attempt (lease lapsed)",
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount:
        log.error(
            "dead letter: %d %s row(s) lost their worker on the final attempt", result.rowcount, model.__tablename__
        )
    return result.rowcount


def _due_ids(model, now, grace, limit) -> list[int]:
    stmt = (
        select(model.id)
        .where(
            or_(
                and_(
                    model.status == WorkStatus.PENDING,
                    model.next_attempt_at <= now,
                    or_(model.enqueued_at.is_(None), model.enqueued_at <= now - grace),
                ),
                and_(
                    model.status == WorkStatus.PROCESSING,
                    model.claimed_until < now,
                    model.attempts < model.max_attempts,
                ),
            )
        )
        .order_by(model.next_attempt_at, model.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    ids = list(db.session.execute(stmt).scalars())
    if ids:
        db.session.execute(
            update(model).where(model.id.in_(ids)).values(enqueued_at=now).execution_options(synchronize_session=False)
        )
    return ids


def relay_once(now: datetime | None = None, horizon_seconds: float | None = None) -> dict:
    now = now or utcnow()
    cfg = current_app.config
    grace = timedelta(seconds=cfg["RELAY_GRACE_SECONDS"])
    limit = cfg["RELAY_BATCH_SIZE"]
    try:
        dead = _bury_exhausted(OutboxDelivery, now) + _bury_exhausted(ScheduledCommand, now)
        delivery_ids = _due_ids(OutboxDelivery, now, grace, limit)
        command_ids = _due_ids(ScheduledCommand, now, grace, limit)
        db.session.commit()
    except Exception:
        db.session.rollback()
        raise
    queue.announce([], [(cid, now) for cid in command_ids], now=now)
    if delivery_ids:
        # A drain runs every due delivery, these included. Forced: the drain slot may belong to
        # a drain Redis lost, and the relay is what recovers from that.
        queue.request_drain(force=True)
    horizon = horizon_seconds if horizon_seconds is not None else 3 * cfg["RELAY_INTERVAL_SECONDS"]
    rearmed = rearm_future_commands(now, now + timedelta(seconds=horizon))
    counts = {"deliveries": len(delivery_ids), "commands": len(command_ids), "rearmed": rearmed, "dead": dead}
    if delivery_ids or command_ids or rearmed:
        log.info("relay re-announced %s", counts)
    return counts


def rearm_future_commands(now: datetime, until: datetime | None = None, chunk: int = 500) -> int:
    """Hand pending commands due after `now` (up to `until`, or all) to rq-scheduler when it no
    longer has them, e.g. after a Redis wipe. A deadline then runs late, never not at all."""
    rearmed = 0
    after_id = 0
    while True:
        stmt = (
            select(ScheduledCommand.id, ScheduledCommand.next_attempt_at)
            .where(
                ScheduledCommand.status == WorkStatus.PENDING,
                ScheduledCommand.next_attempt_at > now,
                ScheduledCommand.id > after_id,
            )
            .order_by(ScheduledCommand.id)
            .limit(chunk)
        )
        if until is not None:
            stmt = stmt.where(ScheduledCommand.next_attempt_at <= until)
        rows = db.session.execute(stmt).all()
        db.session.rollback()
        if not rows:
            return rearmed
        for command_id, due in rows:
            if not queue.command_is_scheduled(command_id):
                queue.enqueue_command(command_id, due)
                rearmed += 1
        after_id = rows[-1][0]
