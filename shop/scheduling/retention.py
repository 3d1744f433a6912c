"""The prune: finished records past their retention (shop.domain.retention) removed in small
batches, each its own short transaction, so the tables stay the size of their retention window.

What goes, each kind past its own cutoff:
  event deliveries        done or discarded          (RETENTION_DAYS after they finished)
  scheduled commands      done or obsolete           (the same)
  webhook receipts        any outcome                (RETENTION_DAYS, never under 7 days)
  applied provider events the dedup rows             (RETENTION_DAYS, never under 30 days)
  sweep cycles            finished, not the last ok  (RETENTION_DAYS)
  operator actions        the audit trail            (AUDIT_RETENTION_DAYS)
  emails sent again, stock corrections, card acknowledgements
                          an operator's other records (AUDIT_RETENTION_DAYS)

What never goes: the order, its lines and its transitions (its events: they are the order's
history, docs/ARCHITECTURE.md, Retention), refunds, restore warnings, refused payment proofs and
provider refusals; work that is pending, processing or dead; and nothing at all of an order that
is still owed something (live, watched for late money, a refund not settled, stock not back, an
open restore warning), however old. What was removed of an order is counted on it
(PrunedDetail), so its console page says so.

How it keeps out of checkout's way: a batch selects at most PRUNE_BATCH_SIZE rows along an index
on the age column (oldest first), deletes them and commits, then pauses; PostgreSQL skips rows
another transaction holds (FOR UPDATE SKIP LOCKED) and gives up a batch rather than wait more
than a second for any lock. The rows it deletes belong to finished orders, which nothing else
writes. One prune runs at a time (the `retention` lease); a dry run only counts."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

from flask import current_app
from sqlalchemy import any_, bindparam, delete, func, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import OperationalError

from .. import clock
from ..domain.deadlines import utcnow
from ..domain.retention import Cutoffs, cutoffs
from ..extensions import db
from ..models import Order, PrunedDetail
from ..models.types import UTCDateTime
from ..outbox.leases import acquire_lease, holder_name, release_lease, renew_lease
from ..outbox.tables import table_of
from .prune_kinds import KINDS, Kind

log = logging.getLogger("shop.retention")

LEASE = "retention"
LEASE_SECONDS = 60
# PostgreSQL: a batch that would wait longer than this for a lock is given up (rolled back) and
# the kind left for the next run: the prune waits for no one.
LOCK_TIMEOUT = "1s"
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock_timeout that ran out


@dataclass
class PruneResult:
    """What one run removed (or, dry, would remove), per kind in KINDS' order."""

    cutoffs: Cutoffs
    dry_run: bool
    counts: dict[str, int] = field(default_factory=dict)
    # Stopped before the end (its time was up, other jobs were waiting): rows past their cutoff
    # remain, and the caller runs it again.
    more: bool = False
    # A kind left for the next periodic run because a lock was held past LOCK_TIMEOUT (not `more`:
    # asking again at once would only meet the same lock).
    blocked: list[str] = field(default_factory=list)
    skipped: str | None = None  # why nothing ran (another prune holds the lease)
    batches: int = 0
    seconds: float = 0.0

    def summary(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "removed": dict(self.counts),
            "more": self.more,
            "blocked": list(self.blocked),
            "skipped": self.skipped,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
        }

    def report_lines(self) -> list[str]:
        if self.skipped:
            return [f"nothing pruned: {self.skipped}"]
        verb = "would remove" if self.dry_run else "removed"
        lines = []
        for kind in KINDS:
            cutoff = kind.cutoff(self.cutoffs)
            lines.append(
                f"{kind.name}: {verb} {self.counts.get(kind.name, 0)} {kind.words} older than "
                f"{cutoff:%Y-%m-%d %H:%M} UTC"
            )
        if self.blocked:
            lines.append(f"left for the next run, a lock was held: {', '.join(self.blocked)}")
        if self.more:
            lines.append("stopped before the end: older rows remain; run it again (the periodic job does)")
        return lines


def prune(
    now: datetime | None = None,
    *,
    dry_run: bool = False,
    budget_seconds: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: Callable[[str], None] | None = None,
    batch_size: int | None = None,
    pause: Callable[[], None] | None = None,
) -> PruneResult:
    """Apply the retention rules once. `budget_seconds` and `should_stop` (asked between batches)
    end a run early (`more`); `progress` hears a line every few seconds of a long run; `pause`
    runs between batches (a short sleep by default)."""
    cfg = current_app.config
    now = now or utcnow()
    result = PruneResult(cutoffs(now, cfg["RETENTION_DAYS"], cfg["AUDIT_RETENTION_DAYS"]), dry_run)
    started = clock.current().monotonic()
    if dry_run:
        for kind in KINDS:
            result.counts[kind.name] = _count(kind, result.cutoffs)
            if progress:
                progress(f"{kind.name}: {result.counts[kind.name]} past the cutoff")
        result.seconds = clock.current().monotonic() - started
        return result
    holder = holder_name()
    if not acquire_lease(LEASE, holder, utcnow(), LEASE_SECONDS):
        result.skipped = "another prune is running (the retention lease is held)"
        return result
    run = _Run(
        holder, batch_size or cfg["PRUNE_BATCH_SIZE"], now, started, budget_seconds, should_stop, progress, pause
    )
    try:
        for kind in KINDS:
            if not _prune_kind(kind, result, run):
                result.more = True
                break
    finally:
        release_lease(LEASE, holder)
        result.seconds = clock.current().monotonic() - started
        if any(result.counts.values()):
            log.info("prune: %s", ", ".join(f"{n} {k}" for k, n in result.counts.items() if n))
    return result


@dataclass
class _Run:
    """One prune's holder, batch size and limits, and when it last renewed its lease and spoke."""

    holder: str
    size: int
    now: datetime
    started: float
    budget_seconds: float | None
    should_stop: Callable[[], bool] | None
    progress: Callable[[str], None] | None
    pause: Callable[[], None] | None
    renewed: float = field(default_factory=lambda: clock.current().monotonic())
    said: float = field(default_factory=lambda: clock.current().monotonic())

    def may_go_on(self) -> bool:
        """Between batches: False when its time is up, it was asked to stop, or its lease lapsed
        (a frozen process: let its taker go on); the lease renewed when due."""
        if (self.budget_seconds is not None and clock.current().monotonic() - self.started >= self.budget_seconds) or (
            self.should_stop is not None and self.should_stop()
        ):
            return False
        if clock.current().monotonic() - self.renewed >= LEASE_SECONDS / 4:
            if not renew_lease(LEASE, self.holder, utcnow(), LEASE_SECONDS):
                return False
            self.renewed = clock.current().monotonic()
        return True

    def stand_back(self, removed: int, took: float) -> None:
        if self.pause is not None:
            self.pause()
            return
        cfg = current_app.config
        # Twice as long as the batch took, at least: the busier the database, the slower the
        # batches and the longer the prune stands back, so it never takes more than a third of
        # the database's time from everyone else. And no faster than PRUNE_ROWS_PER_SECOND: every
        # deleted row is WAL that checkout's next commit flushes with its own, and CPU on a
        # machine checkout shares (bench/retention.py, docs/SCALING.md).
        clock.current().sleep(max(cfg["PRUNE_PAUSE_SECONDS"], 2 * took, removed / cfg["PRUNE_ROWS_PER_SECOND"] - took))


def _prune_kind(kind: Kind, result: PruneResult, run: _Run) -> bool:
    """Batches of one kind until none is full (or a lock stops them: `blocked`). False when the
    run must stop before the end (`more`)."""
    result.counts[kind.name] = 0
    reached = None  # the age of the newest row removed so far: the next batch starts there
    while True:
        batch_started = clock.current().monotonic()
        removed, busy, reached = _batch(kind, result.cutoffs, run.size, run.now, reached)
        took = clock.current().monotonic() - batch_started
        result.batches += 1
        result.counts[kind.name] += removed
        if busy:
            result.blocked.append(kind.name)
            return True
        if removed < run.size:
            return True
        if run.progress and clock.current().monotonic() - run.said >= 2:
            run.progress(f"{kind.name}: {result.counts[kind.name]} removed so far...")
            run.said = clock.current().monotonic()
        if not run.may_go_on():
            return False
        run.stand_back(removed, took)


def _where(kind: Kind, cutoff, reached=None) -> list:
    age = kind.table.c[kind.age]
    # `reached`: rows older than the run's last removed row are gone, or are held (owed, live)
    # and stay held for this run; starting the index walk there keeps a batch from stepping over
    # every entry the run has already deleted (they stay in the index until VACUUM), which on a
    # backlog of millions made each batch walk more of the index than the one before.
    return [age < cutoff, *([age >= reached] if reached is not None else []), *kind.conditions()]


def _count(kind: Kind, cuts: Cutoffs) -> int:
    session = db.session
    try:
        return session.execute(
            select(func.count()).select_from(kind.table).where(*_where(kind, kind.cutoff(cuts)))
        ).scalar_one()
    finally:
        session.rollback()


def _batch(kind: Kind, cuts: Cutoffs, size: int, now: datetime, reached=None) -> tuple[int, bool, datetime | None]:
    """One batch in one transaction, of rows at least as old as `reached` (None: the oldest):
    (rows removed, whether a lock made it give up, the age the next batch starts from)."""
    session = db.session
    postgres = session.get_bind().dialect.name == "postgresql"
    t = kind.table
    # correlate(None): the selection reads the table the DELETE names, and must not be folded into it.
    chosen = (
        select(kind.key)
        .where(*_where(kind, kind.cutoff(cuts), reached))
        .order_by(t.c[kind.age])
        .limit(size)
        .correlate(None)
    )
    if postgres:
        # `= ANY(ARRAY(...))`: the chosen keys are gathered once, then each is found by the primary
        # key. With `IN (...)` PostgreSQL hash-joined them against a scan of the whole table,
        # a batch then costing as much as the table is large.
        chosen = chosen.with_for_update(skip_locked=True, of=t)
        statement = delete(t).where(kind.key == any_(func.array(chosen.scalar_subquery())))
    else:
        statement = delete(t).where(kind.key.in_(chosen))
    try:
        if postgres:
            # synchronous_commit off: a batch lost to a crash is only done again by the next run,
            # so the prune need not wait for (nor add) a WAL flush per batch beside checkout's.
            session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            session.execute(text("SET LOCAL synchronous_commit = off"))
        age = t.c[kind.age]
        if kind.counted_as is None:
            ages = session.execute(statement.returning(age)).scalars().all()
        else:
            rows = session.execute(statement.returning(age, t.c.order_id)).all()
            ages = [row[0] for row in rows]
            _count_on_orders(session, kind.counted_as, Counter(row[1] for row in rows if row[1] is not None), now)
        removed = len(ages)
        session.commit()
    except OperationalError as exc:
        session.rollback()
        if postgres and getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            log.info("prune: %s: a lock was held for over %s; left for the next run", kind.name, LOCK_TIMEOUT)
            return 0, True, reached
        raise
    except BaseException:
        session.rollback()
        raise
    return removed, False, max(ages, default=reached)


def _count_on_orders(session, column: str, per_order: Counter, now: datetime) -> None:
    """Add what this batch removed to each known order's PrunedDetail, in order id order (two
    prunes upserting the same orders then lock them in the same order: no deadlock)."""
    if not per_order:
        return
    ids = sorted(per_order)
    if session.get_bind().dialect.name == "postgresql":
        # One round trip, one cached statement: the batch's counts as two arrays, joined to the
        # orders that exist. (Row by row, this was half of a batch's time; as a VALUES list with
        # data, the statement was compiled anew for every batch.)
        session.execute(_UPSERT_FROM_ARRAYS[column], {"ids": ids, "counts": [per_order[i] for i in ids], "now": now})
        return
    known = set(session.execute(select(Order.id).where(Order.id.in_(ids))).scalars())
    rows = [
        {"order_id": order_id, column: per_order[order_id], "first_pruned_at": now, "last_pruned_at": now}
        for order_id in ids
        if order_id in known
    ]
    if rows:
        session.execute(_upsert(column), rows)


def _upsert(column: str):
    t = table_of(PrunedDetail)
    statement = sqlite_insert(t)
    return statement.on_conflict_do_update(
        index_elements=[t.c.order_id],
        set_={column: t.c[column] + statement.excluded[column], "last_pruned_at": statement.excluded.last_pruned_at},
    )


_UPSERT_FROM_ARRAYS = {
    column: text(
        f"""
        INSERT INTO pruned_order_details (order_id, {column}, first_pruned_at, last_pruned_at)
        SELECT batch.order_id, batch.removed, :now, :now
        FROM unnest(CAST(:ids AS integer[]), CAST(:counts AS integer[])) AS batch(order_id, removed)
        WHERE EXISTS (SELECT 1 FROM orders WHERE orders.id = batch.order_id)
        ORDER BY batch.order_id
        ON CONFLICT (order_id) DO UPDATE
        SET {column} = pruned_order_details.{column} + excluded.{column}, last_pruned_at = excluded.last_pruned_at
        """
    ).bindparams(bindparam("now", type_=UTCDateTime()))
    for column in ("deliveries", "commands", "webhook_receipts", "operator_actions")
}
