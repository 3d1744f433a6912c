"""Running durable work (deliveries and scheduled commands) at least once, with a lease,
bounded retries, backoff with jitter and a dead-letter state.

The sequence for one row:
  1. claim: a conditional UPDATE (pending and due, or processing with a lapsed lease, and
     attempts left) that sets a lease and counts the attempt. Two workers never both win it:
     on PostgreSQL the second UPDATE re-reads the row after the first commits and no longer
     matches; on SQLite writers are serialised. A drain claims a small batch the same way, in
     one UPDATE over `... LIMIT n FOR UPDATE SKIP LOCKED` (PostgreSQL; SQLite serialises).
  2. run the handler and mark the row done in ONE transaction, guarded by our claim. A handler
     that writes to the database is therefore exactly-once in effect: its writes and "done"
     commit together, and a worker killed before the commit leaves neither.
  3. on an exception: roll back, then record the failure in its own transaction: back to
     pending with next_attempt_at = now + backoff, or dead after max_attempts (ERROR log).
     A provider that is unavailable (down, timing out, rate-limiting) is not the row's failure:
     the attempt is given back and the row waits for the provider, backing off up to a cap, for
     as long as it takes; a refusal (PermanentFailure) is dead at once
     (domain.deadlines.retry_decision). A DeadEnd is a refusal whose writes stand: they commit
     with the row marked dead in step 2's transaction.

`drain` claims due rows in batches and runs each (a delivery drain or a command drain: the
scheduler's poll wakes one whenever due rows wait, a commit wakes one for what it made due);
`run` claims one row by id and runs it (an RQ job per id, as older releases enqueued them, and
tests); both go through `run_claimed`, so they share steps 2 and 3. A retry or a waiting row
needs no announcement: it is pending with its time, and the poll finds it then.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Callable, Sequence

from flask import current_app
from sqlalchemy import select, update

from .. import clock, logs, traces
from ..domain.deadlines import FAILURE_PROVIDER, retry_decision, utcnow
from ..extensions import db
from ..models import WorkStatus
from ..node import node_name
from . import uow
from .claims import claim, claim_batch, claim_order, claim_returning, mark_dead, mark_done, next_due_within, release

# Raised by handlers and commands; named here too for the callers that catch them.
from .failures import WAITING_FOR_PROVIDER, DeadEnd, PermanentFailure, Reschedule, failure_kind  # noqa: F401

log = logging.getLogger("shop.outbox")


class RunOutcome(StrEnum):
    """What running one claimed row came to (and, for a drain, how many rows each)."""

    DONE = "done"
    RESCHEDULED = "rescheduled"  # not due yet: pending again at its time, no attempt spent
    SKIPPED = "skipped"  # not ours (not claimable, or our claim lapsed)
    RETRY = "retry"  # failed; pending again after a backoff
    WAITING = "waiting"  # the provider did not answer; pending again, no attempt spent
    DEAD = "dead"  # out of attempts, or refused: a dead letter
    RELEASED = "released"  # a drain's only: claimed, then handed back unspent


class LeaseLost(Exception):
    """Our claim lapsed and someone else took the row; our writes must not commit."""


def worker_identity() -> str:
    """This thread, as a claim's `claimed_by`: `node:pid:thread` (the console groups claims by node)."""
    return f"{node_name()}:{os.getpid()}:{threading.get_ident()}"


# A command job by id (as releases before batched drains enqueued them through rq-scheduler,
# which keeps whole seconds and may move a job up to a second early) may claim its row that much
# before its time; the handler decides: a deadline that is not due yet raises Reschedule. Drains
# claim nothing before its time.
EARLY_CLAIM_SECONDS = 2

# A command drain with nothing due waits this long for the next deadline about to fall due (the
# scheduler's poll would wake a drain for it up to a second later; see Work.lookahead_seconds),
# and the poll wakes a command drain for a deadline due within it (relay.wake_due_work).
COMMAND_LOOKAHEAD_SECONDS = 0.5


@dataclass(frozen=True)
class Work:
    """One kind of durable work: its table, how to run a claimed row, how to name it in logs,
    and the loader options its `execute` needs (so one query loads what it reads)."""

    model: Any
    execute: Callable[[Any, datetime], None]
    describe: Callable[[Any], str]
    load_options: tuple = field(default=())
    early_claim_seconds: float = 0
    # A drain that finds nothing due waits (up to this long, within its budget) for a row about
    # to fall due rather than end and leave it to the next poll, up to a poll interval later:
    # deadlines fall due at their own instants, a flash sale's spread over seconds.
    lookahead_seconds: float = 0
    # When this says so (asked before each batch), a drain claims only the kinds claimed first
    # (claims.CLAIMED_FIRST) and leaves the rest for later: the deliveries' emails wait while
    # deadlines are due, so the cores go to the work that gives stock back.
    hold_back_the_rest: Callable[[datetime], bool] | None = None
    # Columns `execute` and `describe` read, when they read nothing else: then the claim's
    # UPDATE returns them and a row claimed by id needs no second query to load it. (`order_id`
    # and `request_id` are read too, for the log context.)
    claim_returns: tuple[str, ...] = field(default=())
    # The log context's key for a row's id: `delivery_id`, `command_id` (shop.logs).
    log_key: str = "work_id"
    # The column naming what a row is for (a delivery's handler, a command's kind): its span's name.
    destination: str = "id"


def _log_scope(work: Work, work_id: int, row) -> object:
    """The row's log context: its id, its order, and the request id it was written with (so the
    lines of work a request left carry that request's id, and so does what this row writes). One
    contextvar set per row, from what the claim already read: no query."""
    if row is None:
        return logs.enter(**{work.log_key: work_id})
    return logs.enter(
        **{work.log_key: work_id}, order_id=getattr(row, "order_id", None), request_id=getattr(row, "request_id", None)
    )


def _span(work: Work, work_id: int, row):
    """The row's span (with tracing on): a child of the span whose commit wrote the row, from the
    traceparent stored beside its request id, and linked to the drain batch running it, if any
    (docs/ARCHITECTURE.md, Tracing). Named as OpenTelemetry's messaging conventions name a
    message's processing: `process <handler or kind>`."""
    if not traces.on():
        return traces.span("")
    if row is None:
        table = work.model.__table__
        found = db.session.execute(
            select(table.c.traceparent, table.c[work.destination]).where(table.c.id == work_id)
        ).first()
        parent, destination = (found[0], found[1]) if found is not None else (None, None)
    else:
        parent, destination = getattr(row, "traceparent", None), getattr(row, work.destination, None)
    return traces.span(
        f"process {destination or work.model.__tablename__}",
        kind=traces.CONSUMER,
        parent=parent,
        links=[traces.traceparent()] if parent else (),
        attributes={
            "messaging.system": "backstop.outbox",
            "messaging.operation.type": "process",
            "messaging.destination.name": destination or work.model.__tablename__,
            "messaging.message.id": str(work_id),
            "backstop.order_id": getattr(row, "order_id", None),
        },
    )


def run_claimed(work: Work, work_id: int, now: datetime, worker: str, row=None) -> RunOutcome:
    """Run a row this worker has claimed, in its span: execute + mark done in one transaction, or
    record the failure in its own."""
    scope = _log_scope(work, work_id, row)
    try:
        with _span(work, work_id, row):
            outcome = _run_claimed(work, work_id, now, worker, row)
            traces.note(outcome=str(outcome))
            return outcome
    finally:
        logs.leave(scope)


def _run_claimed(work: Work, work_id: int, now: datetime, worker: str, row) -> RunOutcome:
    model = work.model
    try:
        with uow.transaction():
            if row is None:
                row = db.session.get(model, work_id, options=list(work.load_options))
                if row is not None:
                    logs.learn(order_id=row.order_id, request_id=row.request_id)
            dead_end = _execute(work, row, now)
            error = f"{type(dead_end).__name__}: {dead_end}" if dead_end else ""
            if not (
                mark_dead(model, work_id, worker, error, utcnow())
                if dead_end
                else mark_done(model, work_id, worker, utcnow())
            ):
                raise LeaseLost(f"{work.describe(row)}: lease lapsed before commit")
        if dead_end is not None:
            log.error("dead letter: %s, its writes kept: %s", work.describe(row), error)
            return RunOutcome.DEAD
        return RunOutcome.DONE
    except Reschedule as exc:  # the transaction has rolled back, as for every exception below
        _reschedule(model, work_id, worker, exc.due, now)
        return RunOutcome.RESCHEDULED
    except LeaseLost as exc:
        log.warning("%s; another worker owns it now, discarding this attempt's writes", exc)
        return RunOutcome.SKIPPED
    except Exception as exc:
        traces.note(error=f"{type(exc).__name__}: {exc}"[:500])
        return record_failure(model, work_id, worker, exc, now, work.describe)


def _execute(work: Work, row, now: datetime) -> DeadEnd | None:
    """Run the row's handler; a DeadEnd it raises is returned, its writes kept for the commit."""
    try:
        work.execute(row, now)
    except DeadEnd as exc:
        return exc
    return None


def run(work: Work, work_id: int, now: datetime | None = None) -> RunOutcome:
    """Claim `work_id` and run it."""
    now = now or utcnow()
    worker = worker_identity()
    try:
        if work.claim_returns:
            row = claim_returning(work.model, work.claim_returns, work_id, now, worker, work.early_claim_seconds)
            if row is None:
                return RunOutcome.SKIPPED
            return run_claimed(work, work_id, now, worker, row=row)
        if not claim(work.model, work_id, now, worker, work.early_claim_seconds):
            return RunOutcome.SKIPPED
        return run_claimed(work, work_id, now, worker)
    finally:
        db.session.remove()


def drain(
    work: Work,
    *,
    batch_size: int,
    budget_seconds: float,
    now: datetime | None = None,
    should_yield: Callable[[], bool] | None = None,
) -> dict:
    """Claim due rows `batch_size` at a time and run each, until none is due, `budget_seconds`
    have passed, or `should_yield()` says other jobs are waiting (checked between batches).
    Returns outcome counts and `more`: True when rows may still be due (the caller asks for
    another drain). `now` pins the clock (tests); otherwise each row runs at its own utcnow()."""
    worker = worker_identity()
    lease = current_app.config["OUTBOX_LEASE_SECONDS"]
    started = clock.current().monotonic()
    counts: Counter = Counter()
    more = False
    session = db.session
    uow.gather_announcements(session)
    try:
        while True:
            claimed_at = now or utcnow()
            claimed_mono = clock.current().monotonic()
            first_only = work.hold_back_the_rest is not None and work.hold_back_the_rest(claimed_at)
            ids = claim_batch(work.model, claimed_at, worker, batch_size, first_only)
            if not ids:
                if now is None and _waited_for_next(work, started, budget_seconds, should_yield):
                    continue
                break
            rows = (
                session.execute(
                    select(work.model)
                    .options(*work.load_options)
                    .where(work.model.id.in_(ids))
                    .order_by(*claim_order(work.model.__table__))
                )
                .unique()
                .scalars()
                .all()
            )
            # Detached with everything execute/describe read already loaded: the commit after
            # each row expires what the session holds, and would reload these one by one.
            # (Expunged before the rollback, which would expire them.)
            session.expunge_all()
            session.rollback()
            more = _run_batch(work, rows, now, worker, claimed_mono + lease / 2, counts)
            uow.publish_gathered(session)  # what the batch's commits made due, in one wake-up
            if more or (len(ids) < batch_size and not work.lookahead_seconds):
                break  # (work with a lookahead claims again: more may have fallen due meanwhile)
            if clock.current().monotonic() - started >= budget_seconds or (should_yield is not None and should_yield()):
                more = True
                break
    finally:
        uow.publish_gathered(session)
        db.session.remove()
    return {**counts, "more": more}


def _run_batch(work: Work, rows: Sequence, now: datetime | None, worker: str, until: float, counts: Counter) -> bool:
    """Run a claimed batch's rows in turn, in the batch's span (linked to each row's writer, as the
    messaging conventions link a batch to its messages). A batch never outlives half its lease
    (`until`, monotonic): the rest goes back, unspent, for the next drain, instead of running with
    a lease someone else may be about to take. True when rows were handed back."""
    with traces.span(
        f"drain {work.model.__tablename__}",
        kind=traces.CONSUMER,
        links=[getattr(row, "traceparent", None) for row in rows],
        attributes={"messaging.system": "backstop.outbox", "messaging.batch.message_count": len(rows)},
    ):
        for index, row in enumerate(rows):
            if index and clock.current().monotonic() > until:
                left = [r.id for r in rows[index:]]
                counts[RunOutcome.RELEASED] += release(work.model, left, worker, now or utcnow())
                return True
            counts[run_claimed(work, row.id, now or utcnow(), worker, row=row)] += 1
            db.session.expunge_all()  # nothing one row loaded leaks into the next
    return False


def _waited_for_next(work: Work, started: float, budget_seconds: float, should_yield) -> bool:
    """Nothing is due: if a row falls due within the work's lookahead (and the drain's budget),
    sleep until then and say so (the caller claims again); False when the drain should end."""
    left = budget_seconds - (clock.current().monotonic() - started)
    if work.lookahead_seconds <= 0 or left <= 0 or (should_yield is not None and should_yield()):
        return False
    now = utcnow()
    due = next_due_within(work.model, now, min(work.lookahead_seconds, left))
    if due is None:
        return False
    clock.current().sleep(max(0.0, (due - now).total_seconds()) + 0.005)
    return True


def _reschedule(model, work_id, worker, due, now) -> None:
    db.session.execute(
        update(model)
        .where(model.id == work_id, model.claimed_by == worker, model.status == WorkStatus.PROCESSING)
        .values(
            status=WorkStatus.PENDING,
            attempts=model.attempts - 1,
            next_attempt_at=due,
            enqueued_at=due,
            claimed_until=None,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    db.session.commit()


def record_failure(model, work_id, worker, exc, now, describe) -> RunOutcome:
    row = db.session.get(model, work_id)
    if row is None or row.claimed_by != worker or row.status != WorkStatus.PROCESSING:
        db.session.rollback()
        return RunOutcome.SKIPPED
    kind = failure_kind(exc)
    cfg = current_app.config
    decision = retry_decision(
        kind,
        row.attempts,
        row.max_attempts,
        row.provider_waits,
        base=cfg["OUTBOX_RETRY_BASE_SECONDS"],
        cap=cfg["OUTBOX_RETRY_CAP_SECONDS"],
        provider_base=cfg["OUTBOX_PROVIDER_RETRY_BASE_SECONDS"],
        provider_cap=cfg["OUTBOX_PROVIDER_RETRY_CAP_SECONDS"],
    )
    error = f"{type(exc).__name__}: {exc}"
    if kind == FAILURE_PROVIDER:
        # Said in the contract's last_error too, for a reader that knows only those fields.
        error = f"{WAITING_FOR_PROVIDER}: {error}"
    row.last_error = error[:4000]
    row.last_traceback = traceback.format_exc()[-20000:]
    row.failure_kind = kind
    row.provider_waits = row.provider_waits + 1 if kind == FAILURE_PROVIDER else 0
    row.claimed_until = None
    label = describe(row)
    if decision.dead:
        row.status = WorkStatus.DEAD
        db.session.commit()
        log.error("dead letter: %s failed %d time(s), last error: %s", label, row.attempts, row.last_error)
        return RunOutcome.DEAD
    if not decision.spends_attempt:
        row.attempts -= 1  # the claim counted it; a provider outage is not this row's failure
    row.status = WorkStatus.PENDING
    row.next_attempt_at = now + timedelta(seconds=decision.delay_seconds)
    row.enqueued_at = row.next_attempt_at
    attempts, waits = row.attempts, row.provider_waits
    db.session.commit()
    if kind == FAILURE_PROVIDER:
        log.warning(
            "%s is waiting for the provider (%d failure(s) in a row, attempts kept at %d of %d), retrying in %.1fs: %s",
            label,
            waits,
            attempts,
            row.max_attempts,
            decision.delay_seconds,
            error,
        )
        return RunOutcome.WAITING
    log.warning(
        "%s failed (attempt %d of %d), retrying in %.1fs: %s",
        label,
        attempts,
        row.max_attempts,
        decision.delay_seconds,
        row.last_error,
    )
    return RunOutcome.RETRY
