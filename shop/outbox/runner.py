"""Running one unit of durable work (a delivery or a scheduled command) at least once, with a
lease, bounded retries, backoff with jitter and a dead-letter state.

The sequence for one row:
  1. claim: a conditional UPDATE (pending and due, or processing with a lapsed lease, and
     attempts left) that sets a lease and counts the attempt. Two workers never both win it:
     on PostgreSQL the second UPDATE re-reads the row after the first commits and no longer
     matches; on SQLite writers are serialised.
  2. run the handler and mark the row done in ONE transaction, guarded by our claim. A handler
     that writes to the database is therefore exactly-once in effect: its writes and "done"
     commit together, and a worker killed before the commit leaves neither.
  3. on an exception: roll back, then record the failure in its own transaction: back to
     pending with next_attempt_at = now + backoff, or dead after max_attempts (ERROR log).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import and_, or_, update

from ..domain.deadlines import retry_delay_seconds, utcnow
from ..extensions import db
from . import uow

log = logging.getLogger("shop.outbox")


class PermanentFailure(Exception):
    """A handler's way to say "retrying cannot help": the row goes straight to dead."""


class Reschedule(Exception):
    """Not due yet (a scheduler may fire up to a second early): run again at `due`, without
    spending an attempt."""

    def __init__(self, due: datetime):
        super().__init__(f"not due until {due.isoformat()}")
        self.due = due


class LeaseLost(Exception):
    """Our claim lapsed and someone else took the row; our writes must not commit."""


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


# rq-scheduler stores whole seconds and moves a job up to a second before its time. Refusing
# such a run would drop the job and leave the row to the relay (seconds late); claiming it lets
# the handler decide: a deadline that is not due yet raises Reschedule.
EARLY_CLAIM_SECONDS = 2


def claim(model, work_id: int, now: datetime, worker: str) -> bool:
    lease = timedelta(seconds=current_app.config["OUTBOX_LEASE_SECONDS"])
    claimable = and_(
        model.id == work_id,
        model.attempts < model.max_attempts,
        or_(
            and_(model.status == "pending", model.next_attempt_at <= now + timedelta(seconds=EARLY_CLAIM_SECONDS)),
            and_(model.status == "processing", model.claimed_until < now),
        ),
    )
    result = db.session.execute(
        update(model).where(claimable).values(
            status="processing", claimed_by=worker, claimed_until=now + lease,
            attempts=model.attempts + 1, updated_at=now,
        ).execution_options(synchronize_session=False)
    )
    db.session.commit()
    return result.rowcount == 1


def run(model, work_id: int, execute, describe, now: datetime | None = None) -> str:
    """Claim `work_id` and run `execute(row, now)`. Returns done | skipped | retry | dead."""
    now = now or utcnow()
    worker = worker_identity()
    try:
        if not claim(model, work_id, now, worker):
            return "skipped"
        try:
            row = db.session.get(model, work_id)
            execute(row, now)
            marked = db.session.execute(
                update(model).where(model.id == work_id, model.claimed_by == worker,
                                    model.status == "processing")
                .values(status="done", completed_at=utcnow(), claimed_until=None, updated_at=utcnow(),
                        last_error=None)
                .execution_options(synchronize_session=False)
            )
            if marked.rowcount != 1:
                raise LeaseLost(f"{describe(row)}: lease lapsed before commit")
            uow.commit(db.session)
            uow.publish_after_commit(db.session)
            return "done"
        except Reschedule as exc:
            uow.rollback(db.session)
            _reschedule(model, work_id, worker, exc.due, now)
            return "rescheduled"
        except LeaseLost as exc:
            uow.rollback(db.session)
            log.warning("%s; another worker owns it now, discarding this attempt's writes", exc)
            return "skipped"
        except Exception as exc:
            uow.rollback(db.session)
            return record_failure(model, work_id, worker, exc, now, describe)
    finally:
        db.session.remove()


def _reschedule(model, work_id, worker, due, now) -> None:
    db.session.execute(
        update(model).where(model.id == work_id, model.claimed_by == worker, model.status == "processing")
        .values(status="pending", attempts=model.attempts - 1, next_attempt_at=due, enqueued_at=due,
                claimed_until=None, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    db.session.commit()
    _announce_retry(model, work_id, due)


def record_failure(model, work_id, worker, exc, now, describe) -> str:
    row = db.session.get(model, work_id)
    if row is None or row.claimed_by != worker or row.status != "processing":
        db.session.rollback()
        return "skipped"
    permanent = isinstance(exc, PermanentFailure)
    row.last_error = f"{type(exc).__name__}: {exc}"[:4000]
    row.last_traceback = traceback.format_exc()[-20000:]
    row.claimed_until = None
    label = describe(row)
    if permanent or row.attempts >= row.max_attempts:
        row.status = "dead"
        db.session.commit()
        log.error("dead letter: %s failed %d time(s), last error: %s", label, row.attempts, row.last_error)
        return "dead"
    delay = retry_delay_seconds(row.attempts, current_app.config["OUTBOX_RETRY_BASE_SECONDS"],
                                current_app.config["OUTBOX_RETRY_CAP_SECONDS"])
    row.status = "pending"
    row.next_attempt_at = now + timedelta(seconds=delay)
    row.enqueued_at = row.next_attempt_at
    due = row.next_attempt_at
    db.session.commit()
    log.warning("%s failed (attempt %d of %d), retrying in %.1fs: %s", label, row.attempts, row.max_attempts,
                delay, row.last_error)
    _announce_retry(model, work_id, due)
    return "retry"


def _announce_retry(model, work_id, due):
    from .. import queue
    from ..models import ScheduledCommand

    try:
        if model is ScheduledCommand:
            queue.enqueue_command(work_id, due)
        else:
            queue.scheduler().enqueue_at(due, queue.DELIVERY_JOB, work_id, job_result_ttl=0, timeout=300)
    except Exception as exc:  # the relay picks it up once it is due
        log.warning("could not schedule the retry in Redis (%s); the relay will", exc)


def retry_dead(model, work_id: int, now: datetime | None = None) -> bool:
    """Operator action: a dead row runs again with a fresh attempt budget."""
    now = now or utcnow()
    result = db.session.execute(
        update(model).where(model.id == work_id, model.status == "dead").values(
            status="pending", attempts=0, max_attempts=current_app.config["OUTBOX_MAX_ATTEMPTS"],
            next_attempt_at=now, enqueued_at=now, claimed_by=None, claimed_until=None, updated_at=now,
        ).execution_options(synchronize_session=False)
    )
    db.session.commit()
    return result.rowcount == 1


def discard(model, work_id: int, reason: str, now: datetime | None = None) -> bool:
    now = now or utcnow()
    result = db.session.execute(
        update(model).where(model.id == work_id, model.status.in_(("dead", "pending"))).values(
            status="discarded", discard_reason=reason, completed_at=now, updated_at=now,
        ).execution_options(synchronize_session=False)
    )
    db.session.commit()
    return result.rowcount == 1
