"""Claiming durable work: the conditional UPDATEs that give one worker a row (or a drain a batch)
with a lease and count the attempt, the guarded "done", and handing back rows a drain will not
run. On PostgreSQL a second claimer re-reads the row after the first commits and no longer
matches; on SQLite writers are serialised.

The statements go to the tables (Core), not through the ORM's bulk UPDATE machinery (they touch
no loaded object), and are built once per table with bound parameters: building a statement
costs more CPU than executing its cached compiled form."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import and_, bindparam, case, func, or_, select, update

from ..domain.deadlines import FAILURE_REFUSED
from ..extensions import db
from ..models import CommandKind, WorkStatus
from .tables import rows_matched


def _claimable(t):
    return and_(
        t.c.attempts < t.c.max_attempts,
        or_(
            and_(
                t.c.status == WorkStatus.PENDING,
                t.c.next_attempt_at <= bindparam("due_by", type_=t.c.next_attempt_at.type),
            ),
            and_(
                t.c.status == WorkStatus.PROCESSING, t.c.claimed_until < bindparam("at", type_=t.c.claimed_until.type)
            ),
        ),
    )


def _claim_values(t) -> dict:
    return dict(
        status=WorkStatus.PROCESSING,
        claimed_by=bindparam("worker"),
        claimed_until=bindparam("lease_until", type_=t.c.claimed_until.type),
        attempts=t.c.attempts + 1,
        updated_at=bindparam("at", type_=t.c.updated_at.type),
    )


@functools.cache
def _claim_one(t):
    return update(t).where(t.c.id == bindparam("work_id"), _claimable(t)).values(**_claim_values(t))


@functools.cache
def _claim_one_returning(t, columns: tuple[str, ...]):
    return _claim_one(t).returning(*(t.c[name] for name in columns))


# What a drain claims first among the rows due: the work that gives stock back (a cancelled
# order's restore, an unpaid order's deadline) or moves held money (a ship's capture, a cancel's
# void, a hold's own deadline, which must run before the hold lapses) before the work that only
# tells someone (emails). Under a backlog, stock is back on sale and held money taken or released
# in the time that work alone takes; the emails follow. Within a rank, oldest due first. By
# column and name, as the writer stores them.
CLAIMED_FIRST = {
    "outbox_deliveries": ("handler", ("restore_inventory",)),
    "scheduled_commands": (
        "kind",
        (CommandKind.EXPIRE_UNPAID_ORDER, CommandKind.CAPTURE_PAYMENT, CommandKind.VOID_PAYMENT, CommandKind.END_HOLD),
    ),
}


def _rank(t):
    column, names = CLAIMED_FIRST.get(t.name, (None, ()))
    if not names:
        return None
    return case((t.c[column].in_(names), 0), else_=1)


def claim_order(t) -> tuple:
    """The order a batch is claimed in, and runs in (runner.drain): the kinds claimed first, then
    oldest due, then by id."""
    return tuple(key for key in (_rank(t), t.c.next_attempt_at, t.c.id) if key is not None)


def _first_kinds(t):
    column, names = CLAIMED_FIRST[t.name]
    return t.c[column].in_(names)


@functools.cache
def _claim_many(t, first_only: bool = False):
    # A CTE, evaluated once: as `id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)` PostgreSQL
    # may run the subquery again per row and claim more than n.
    due = (
        select(t.c.id)
        .where(_claimable(t), *((_first_kinds(t),) if first_only else ()))
        .order_by(*claim_order(t))
        .limit(bindparam("batch"))
        .with_for_update(skip_locked=True)
        .cte("due")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    return update(t).where(t.c.id.in_(select(due.c.id)), _claimable(t)).values(**_claim_values(t)).returning(t.c.id)


@functools.cache
def _first_due(t):
    return select(t.c.id).where(_claimable(t)).limit(1)


@functools.cache
def _mark_done(t):
    return (
        update(t)
        .where(
            t.c.id == bindparam("work_id"), t.c.claimed_by == bindparam("worker"), t.c.status == WorkStatus.PROCESSING
        )
        .values(
            status=WorkStatus.DONE,
            completed_at=bindparam("done_at", type_=t.c.completed_at.type),
            claimed_until=None,
            updated_at=bindparam("done_at", type_=t.c.updated_at.type),
            last_error=None,
        )
    )


def _claim_params(now: datetime, worker: str, early_seconds: float = 0) -> dict:
    lease = timedelta(seconds=current_app.config["OUTBOX_LEASE_SECONDS"])
    return dict(due_by=now + timedelta(seconds=early_seconds), at=now, worker=worker, lease_until=now + lease)


@functools.cache
def _next_pending(t):
    after = bindparam("after", type_=t.c.next_attempt_at.type)
    return (
        select(t.c.next_attempt_at)
        .where(t.c.status == WorkStatus.PENDING, t.c.next_attempt_at > after)
        .order_by(t.c.next_attempt_at)
        .limit(1)
    )


def next_due_within(model, now: datetime, seconds: float) -> datetime | None:
    """When the next pending row not yet due falls due, if that is within `seconds` of `now` (None
    otherwise): one lookup on the (status, next_attempt_at) index, ending its own transaction.
    (A row already due that the caller could not claim is someone else's: not waited for.)"""
    try:
        due = db.session.execute(_next_pending(model.__table__), {"after": now}).scalar()
    finally:
        db.session.rollback()
    # Aware on every backend: next_attempt_at is a UTCDateTime, which gives SQLite's naive text its UTC.
    return due if due is not None and due <= now + timedelta(seconds=seconds) else None


@functools.cache
def _count_due(t, column: str):
    return (
        select(func.count())
        .select_from(t)
        .where(
            t.c.status == WorkStatus.PENDING,
            t.c.next_attempt_at <= bindparam("due_by", type_=t.c.next_attempt_at.type),
            t.c[column] == bindparam("name"),
        )
    )


def count_due(model, column: str, name: str, by: datetime) -> int:
    """How many pending rows of one kind (`column` == `name`) are due by `by`: a range of the
    (status, next_attempt_at) index. In the caller's transaction."""
    return db.session.execute(_count_due(model.__table__, column), {"due_by": by, "name": name}).scalar_one()


@functools.cache
def _first_due_first(t):
    return select(t.c.id).where(_claimable(t), _first_kinds(t)).limit(1)


def any_claimed_first_due(model, by: datetime) -> bool:
    """Is a row of the kinds claimed first (CLAIMED_FIRST: a restore, a deadline) claimable with
    `by` as the time (due by then, or its lease lapsed by then)? Ends its own transaction."""
    try:
        return db.session.execute(_first_due_first(model.__table__), dict(due_by=by, at=by)).first() is not None
    finally:
        db.session.rollback()


def any_due(model, now: datetime) -> bool:
    """Is any row claimable now (pending and due, or with a lapsed lease and attempts left)? What
    every scheduler asks each poll; one indexed lookup that ends its own transaction."""
    try:
        return db.session.execute(_first_due(model.__table__), dict(due_by=now, at=now)).first() is not None
    finally:
        db.session.rollback()


@functools.cache
def _due_writers(t):
    return select(t.c.traceparent).where(_claimable(t), t.c.traceparent.is_not(None)).limit(bindparam("most"))


def due_writers(model, now: datetime, most: int) -> list[str]:
    """The traceparents stored on up to `most` rows claimable by `now` (with tracing on, the poll
    that wakes a drain for them links its span to their writers). Ends its own transaction."""
    try:
        return list(db.session.execute(_due_writers(model.__table__), dict(due_by=now, at=now, most=most)).scalars())
    finally:
        db.session.rollback()


def claim(model, work_id: int, now: datetime, worker: str, early_seconds: float = 0) -> bool:
    result = db.session.execute(
        _claim_one(model.__table__), dict(_claim_params(now, worker, early_seconds), work_id=work_id)
    )
    db.session.commit()
    return rows_matched(result) == 1


def claim_batch(model, now: datetime, worker: str, limit: int, first_only: bool = False) -> list[int]:
    """Claim up to `limit` due rows in one statement: the stock-freeing kinds first
    (CLAIMED_FIRST), then oldest first; with `first_only`, those kinds alone. Concurrent drains
    on PostgreSQL skip each other's locked rows instead of waiting; the outer WHERE repeats the
    condition so a row claimed and committed meanwhile is never taken twice."""
    statement = _claim_many(model.__table__, first_only)
    ids = db.session.execute(statement, dict(_claim_params(now, worker), batch=limit)).scalars().all()
    db.session.commit()
    return sorted(ids)


def release(model, work_ids: list[int], worker: str, now: datetime) -> int:
    """Hand back claimed rows we will not run now (a drain out of time), without spending the
    attempt; the next drain takes them."""
    if not work_ids:
        return 0
    t = model.__table__
    result = db.session.execute(
        update(t)
        .where(t.c.id.in_(work_ids), t.c.claimed_by == worker, t.c.status == WorkStatus.PROCESSING)
        .values(
            status=WorkStatus.PENDING, attempts=t.c.attempts - 1, claimed_by=None, claimed_until=None, updated_at=now
        )
    )
    db.session.commit()
    return rows_matched(result)


def claim_returning(
    model, columns: tuple[str, ...], work_id: int, now: datetime, worker: str, early_seconds: float = 0
):
    """`claim`, returning the claimed row's `columns` (None when not claimed)."""
    row = db.session.execute(
        _claim_one_returning(model.__table__, columns),
        dict(_claim_params(now, worker, early_seconds), work_id=work_id),
    ).first()
    db.session.commit()
    return row


def mark_done(model, work_id: int, worker: str, done_at: datetime) -> bool:
    """Inside the run's transaction: the row is done, if our claim still holds it."""
    marked = db.session.execute(_mark_done(model.__table__), dict(work_id=work_id, worker=worker, done_at=done_at))
    return rows_matched(marked) == 1


def mark_dead(model, work_id: int, worker: str, error: str, at: datetime) -> bool:
    """Inside the run's transaction: the row is a dead letter saying `error` (a DeadEnd: the run's
    writes commit with it), if our claim still holds it."""
    t = model.__table__
    marked = db.session.execute(
        update(t)
        .where(t.c.id == work_id, t.c.claimed_by == worker, t.c.status == WorkStatus.PROCESSING)
        .values(
            status=WorkStatus.DEAD,
            last_error=error[:4000],
            failure_kind=FAILURE_REFUSED,
            claimed_until=None,
            updated_at=at,
        )
    )
    return rows_matched(marked) == 1
