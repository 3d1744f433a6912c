"""RQ job entry points: thin, id-only, each runs inside the worker's app context.

A worker started by `flask shop worker` already has an app context; anything else (a forking
worker, a bare `rq worker`) gets one built here.
"""

from __future__ import annotations

from contextlib import contextmanager

from flask import current_app, has_app_context

from . import create_app, failpoints, queue, traces
from .extensions import db
from .outbox import dispatch
from .outbox.relay import relay_once
from .outbox.runner import RunOutcome
from .scheduling import retention
from .scheduling.lease import abandoned_holder
from .scheduling.sweep import run_cycle


@contextmanager
def _app_context():
    if has_app_context():
        yield
        return
    with create_app().app_context():
        yield


def run_delivery(delivery_id: int) -> RunOutcome:
    with _app_context():
        return dispatch.run_delivery(delivery_id)


def _drain_span(kind: queue.Drain):
    """A drain job's span (with tracing on): linked to the span that woke it (a commit's request, a
    scheduler's poll), its batches inside it."""
    return traces.span(
        f"drain {kind} job",
        kind=traces.CONSUMER,
        links=[queue.waker()] if traces.on() else (),
        attributes={"messaging.system": "rq", "messaging.operation.type": "process"},
    )


def drain(slot: int | None = None) -> dict:
    """Run due deliveries in batches (see queue.DRAIN_SLOTS): free our slot FIRST, so work
    announced while we run wakes another drain; hand the worker back to queued jobs between
    batches; ask for another drain if rows may still be due when we stop."""
    with _app_context(), _drain_span(queue.Drain.DELIVERIES):
        queue.drain_started(slot)
        result = dispatch.drain_deliveries_concurrently(dispatch.drain_threads(), should_yield=queue.other_jobs_waiting)
        if result["more"]:
            queue.request_drain()
        return result


# A command drain's successor may jump the queue (queue.request_drain) only while no restore
# has been due longer than this: priority for the deadlines, with aging, so that restores (the
# stock back on sale) wait out a burst of deadlines for seconds at most, never for all of it.
RESTORE_PATIENCE_SECONDS = 3.0


def drain_commands(slot: int | None = None) -> dict:
    """Run due scheduled commands (deadlines, emails, refunds) in batches, as `drain` runs
    deliveries: the scheduler's poll and a commit that made a command due wake one."""
    with _app_context(), _drain_span(queue.Drain.COMMANDS):
        queue.drain_started(slot, queue.Drain.COMMANDS)
        result = dispatch.drain_commands_concurrently(dispatch.drain_threads(), should_yield=queue.other_jobs_waiting)
        if result["more"]:
            ahead = not dispatch.restores_waiting_longer_than(RESTORE_PATIENCE_SECONDS)
            queue.request_drain(kind=queue.Drain.COMMANDS, continuing=ahead)
        return result


def run_command(command_id: int) -> RunOutcome:
    """One command by id: the job releases before batched command drains enqueued through
    rq-scheduler; such jobs may still be in Redis after an upgrade. (Its failpoint lets a test
    keep a real worker busy with a job the worker accepts.)"""
    failpoints.hit("job.run_command")
    with _app_context():
        return dispatch.run_command(command_id)


def relay() -> dict:
    with _app_context():
        try:
            return relay_once()
        finally:
            db.session.remove()


def reconcile() -> dict:
    with _app_context():
        try:
            return run_cycle().summary()
        finally:
            db.session.remove()


def resume_sweep() -> dict:
    """Queued by a scheduler's poll that found the sweep's lease left behind mid-cycle: run a
    cycle now, which takes the lease over, unless it no longer looks abandoned from here (another
    cycle took it over meanwhile, or its holder is on another machine and has not lapsed yet: the
    scheduler asks again)."""
    with _app_context():
        try:
            if abandoned_holder() is None:
                return {"status": "not needed"}
            return run_cycle().summary()
        finally:
            db.session.remove()


def prune() -> dict:
    """The retention rules, applied in small batches (scheduling.retention): periodic, every
    PRUNE_INTERVAL_SECONDS. The least urgent work there is, so it hands the worker back between
    batches as soon as any other job waits, or after PRUNE_JOB_SECONDS, and then queues its own
    continuation behind them when rows past their cutoff remain."""
    with _app_context():
        try:
            queue.prune_started()
            result = retention.prune(
                budget_seconds=current_app.config["PRUNE_JOB_SECONDS"], should_stop=queue.jobs_waiting
            )
            if result.more:
                queue.request_prune()
            return result.summary()
        finally:
            db.session.remove()
