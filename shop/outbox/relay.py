"""The database tells Redis what is due: the poll and the relay.

`wake_due_work` runs in every scheduler, every poll (SCHEDULER_POLL_SECONDS): two indexed
lookups ask whether any command (a deadline, an email, a refund) or delivery is claimable now,
pending and due or held by a lease that lapsed (its worker died, on this node or another), and
wake a drain of that kind, which claims them in batches. So a deadline needs nothing armed in
Redis, a retry needs no job of its own, and after Redis lost its data, a scheduler restarted or
a node died, due work runs within a poll (a dead holder's rows within its lease plus a poll).

The relay, a periodic job (and once at scheduler start), buries rows whose worker died on
their last attempt and forces a drain for rows that stayed due past a grace period: a drain
slot whose job Redis lost cannot hold them up for long either. A duplicate wake-up is harmless,
since a claim is needed to run.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import and_, or_, select, update

from .. import queue, traces
from ..domain.deadlines import utcnow
from ..extensions import db
from ..models import OutboxDelivery, ScheduledCommand, WorkStatus
from .claims import any_due, due_writers
from .runner import COMMAND_LOOKAHEAD_SECONDS
from .tables import rows_matched

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
    lost = rows_matched(result)
    if lost:
        log.error("dead letter: %d %s row(s) lost their worker on the final attempt", lost, model.__tablename__)
    return lost


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


def relay_once(now: datetime | None = None) -> dict:
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
    # A drain runs every due row of its kind, these included. Forced: the drain slot may belong
    # to a drain Redis lost, and the relay is what recovers from that.
    if delivery_ids:
        queue.request_drain(force=True, kind=queue.Drain.DELIVERIES)
    if command_ids:
        queue.request_drain(force=True, kind=queue.Drain.COMMANDS)
    counts = {"deliveries": len(delivery_ids), "commands": len(command_ids), "dead": dead}
    if delivery_ids or command_ids:
        log.info("relay re-announced %s", counts)
    return counts


def wake_due_work(now: datetime | None = None) -> dict:
    """Every scheduler's poll: wake a drain of each kind that has a claimable row now; for the
    commands, also one falling due within a command drain's lookahead (runner), which the
    drain waits for: the first deadlines of a burst run at their instant, not up to a poll late."""
    now = now or utcnow()
    kinds = [kind for kind, model, by in _DUE if any_due(model, by(now))]
    if kinds:
        # With tracing on, a span linked to the writers of the rows found due (a few of each kind):
        # the trace of a checkout whose work waited (no worker free, a wake-up lost) shows the poll
        # that woke a drain for it.
        writers = (
            [w for kind, model, by in _DUE if kind in kinds for w in due_writers(model, by(now), LINKED_WRITERS)]
            if traces.on()
            else []
        )
        woke = {"backstop.woke": ",".join(kinds)}
        with traces.span("wake drains", kind=traces.PRODUCER, links=writers, attributes=woke):
            queue.wake(*kinds)
    return {"woke": [str(kind) for kind in kinds]}


# The poll's kinds: the drain each wakes, its table, and the time by which its rows count as due.
_DUE = (
    (queue.Drain.COMMANDS, ScheduledCommand, lambda now: now + timedelta(seconds=COMMAND_LOOKAHEAD_SECONDS)),
    (queue.Drain.DELIVERIES, OutboxDelivery, lambda now: now),
)
# The writers a poll's span links to, at most, per kind.
LINKED_WRITERS = 8
