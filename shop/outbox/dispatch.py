"""Entry points that run deliveries and scheduled commands: one by id, or deliveries in drains;
the handlers and command kinds they run, as the app factory registered them (`init_app`); and an
operator's verbs on a row (retry a dead one, retry every dead one of a kind, discard)."""

from __future__ import annotations

import contextvars
import functools
import threading
from collections import Counter
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, cast

from flask import Flask, current_app
from sqlalchemy.orm import joinedload
from werkzeug.local import LocalProxy

from .. import queue
from ..domain.deadlines import utcnow
from ..domain.events import event_from_payload
from ..models import OutboxDelivery, ScheduledCommand
from . import claims, requeue, runner
from .announce import announce_or_leave_to_relay
from .failures import PermanentFailure
from .runner import RunOutcome

# A drain claims this many rows per statement and, when other jobs wait, hands the worker back
# after this long.
DRAIN_BATCH_SIZE = 20
DRAIN_BUDGET_SECONDS = 2.0


def drain_threads() -> int:
    """How many threads one drain job runs. A delivery spends about as long waiting for
    PostgreSQL as running Python, so more threads fill those waits, up to about three, past which
    the GIL and the cores are the limit (bench/compensation.py prints the drain's throughput).
    SQLite serialises writers: one thread."""
    if current_app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        return 1
    return current_app.config.get("DRAIN_THREADS", 3)


Handler = Callable[[Any, datetime], None]  # handler(event, now), named in subscriptions.py
Command = Callable[[ScheduledCommand, datetime], None]  # command(row, now), named by the row's kind
_REGISTRY = "shop.outbox.work"


def init_app(app, *, handlers: Mapping[str, Handler], commands: Mapping[str, Command]) -> None:
    """The app factory hands the outbox the use cases' work by name (saga.HANDLERS,
    scheduling.commands.COMMANDS): the outbox runs them without importing the layers above it.
    The mappings are kept as given, not copied, so what is added to them later is found."""
    app.extensions[_REGISTRY] = (handlers, commands)


def _registered() -> tuple[Mapping[str, Handler], Mapping[str, Command]]:
    try:
        return current_app.extensions[_REGISTRY]
    except KeyError:
        # Not a PermanentFailure: the row is fine, this process is not. It is retried later.
        raise RuntimeError(
            "no handlers or commands registered with the outbox; build the app with "
            "shop.create_app, which registers them"
        ) from None


def _handlers() -> Mapping[str, Handler]:
    return _registered()[0]


def _commands() -> Mapping[str, Command]:
    return _registered()[1]


def _describe_delivery(row) -> str:
    return f"delivery {row.id} ({row.event.name if row.event else '?'} -> {row.handler}, order {row.order_id})"


def _describe_command(row) -> str:
    return f"command {row.id} ({row.kind}, order {row.order_id})"


def _execute_delivery(row: OutboxDelivery, now: datetime) -> None:
    handler = _handlers().get(row.handler)
    if handler is None:
        raise PermanentFailure(f"no handler named {row.handler!r}")
    handler(event_from_payload(row.event.name, row.event.payload), now)


def _execute_command(row: ScheduledCommand, now: datetime) -> None:
    command = _commands().get(row.kind)
    if command is None:
        raise PermanentFailure(f"no command named {row.kind!r}")
    command(row, now)


def _deadlines_due(now: datetime) -> bool:
    return claims.any_claimed_first_due(ScheduledCommand, now)


DELIVERIES = runner.Work(
    OutboxDelivery,
    _execute_delivery,
    _describe_delivery,
    load_options=(joinedload(OutboxDelivery.event),),
    # While deadlines are due, delivery drains run the restores and hold the emails back (the
    # scheduler's next poll wakes a drain for them): a flash sale's deadlines get the cores.
    hold_back_the_rest=_deadlines_due,
    log_key="delivery_id",
    destination="handler",
)
# A command reads only these (commands/handlers load what else they need themselves; the runner
# reads the request id for the log context).
COMMANDS = runner.Work(
    ScheduledCommand,
    _execute_command,
    _describe_command,
    early_claim_seconds=runner.EARLY_CLAIM_SECONDS,
    claim_returns=("id", "kind", "order_id", "payload", "request_id", "traceparent"),
    lookahead_seconds=runner.COMMAND_LOOKAHEAD_SECONDS,
    log_key="command_id",
    destination="kind",
)


def run_delivery(delivery_id: int, now: datetime | None = None) -> RunOutcome:
    return runner.run(DELIVERIES, delivery_id, now)


def run_command(command_id: int, now: datetime | None = None) -> RunOutcome:
    return runner.run(COMMANDS, command_id, now)


def drain(
    work: runner.Work,
    now: datetime | None = None,
    should_yield: Callable[[], bool] | None = None,
    batch_size: int | None = None,
    budget_seconds: float | None = None,
) -> dict:
    """Run every due row of `work` (pending and due, or with a lapsed lease), a batch at a time."""
    return runner.drain(
        work,
        batch_size=batch_size or DRAIN_BATCH_SIZE,
        budget_seconds=DRAIN_BUDGET_SECONDS if budget_seconds is None else budget_seconds,
        now=now,
        should_yield=should_yield,
    )


def drain_deliveries(now: datetime | None = None, **kwargs) -> dict:
    return drain(DELIVERIES, now, **kwargs)


def drain_commands(now: datetime | None = None, **kwargs) -> dict:
    return drain(COMMANDS, now, **kwargs)


def drain_concurrently(
    work: runner.Work,
    threads: int,
    should_yield: Callable[[], bool] | None = None,
    batch_size: int | None = None,
    budget_seconds: float | None = None,
    now: datetime | None = None,
) -> dict:
    """`drain` in `threads` threads of this process, each with its own app context, session and
    connection. They never share a row: each claims its own batches (SKIP LOCKED), and
    everything else a row relies on (the marker's version check, leases, the claim guard on
    "done") already holds between processes. Returns the summed counts; `more` if any thread
    stopped with rows possibly still due. A thread's unexpected error is re-raised here after
    the others finish (their rows are committed or released, never half-run)."""
    run = functools.partial(
        drain, work, now=now, should_yield=should_yield, batch_size=batch_size, budget_seconds=budget_seconds
    )
    if threads <= 1:
        return run()
    # The app itself for the threads, which have no app context of their own (current_app is a
    # werkzeug LocalProxy, though Flask types it as the Flask it stands for).
    app = cast("LocalProxy[Flask]", current_app)._get_current_object()
    results: list[dict | None] = [None] * threads
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            with app.app_context():
                results[index] = run()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread below
            errors.append(exc)

    # Each thread runs in a copy of this one's context: its log lines carry the job's id too.
    pool = [
        threading.Thread(target=contextvars.copy_context().run, args=(one, i), name=f"drain-{i}", daemon=True)
        for i in range(threads)
    ]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise errors[0]
    counts: Counter = Counter()
    more = False
    for result in results:
        more = more or bool(result and result.get("more"))
        counts.update({k: v for k, v in (result or {}).items() if k != "more"})
    return {**counts, "more": more}


def restores_waiting_longer_than(seconds: float) -> bool:
    """Has a restore (a delivery claimed first: claims.CLAIMED_FIRST) been due for more than
    `seconds` without being run? The emails, claimed after, may wait longer by design."""
    return claims.any_claimed_first_due(OutboxDelivery, utcnow() - timedelta(seconds=seconds))


def drain_deliveries_concurrently(threads: int, **kwargs) -> dict:
    return drain_concurrently(DELIVERIES, threads, **kwargs)


def drain_commands_concurrently(threads: int, **kwargs) -> dict:
    return drain_concurrently(COMMANDS, threads, **kwargs)


# -- an operator's verbs on a row, by its kind as the console names it ----------------------

TABLES = {"delivery": OutboxDelivery, "command": ScheduledCommand}


_DRAINS = {"delivery": queue.Drain.DELIVERIES, "command": queue.Drain.COMMANDS}


def _announce(kind: str, work_id: int) -> bool:
    """Wake a drain for a row that is pending and due now; False (logged) when Redis does not
    answer, in which case the scheduler's next poll wakes one."""
    return announce_or_leave_to_relay(lambda: queue.wake(_DRAINS[kind]), f"{kind} %s is due again", work_id)


def retry_dead(kind: str, work_id: int, now: datetime | None = None) -> bool:
    """A dead delivery or command runs again now, with a fresh attempt budget. False when it
    was not dead (any more)."""
    if not requeue.retry_dead(TABLES[kind], work_id, now):
        return False
    _announce(kind, work_id)
    return True


def retry_all_dead(kind: str, name: str) -> list[int]:
    """Every dead row of one handler (deliveries) or command kind runs again, each with a fresh
    budget. Returns their ids."""
    model = TABLES[kind]
    column = model.__table__.c.handler if kind == "delivery" else model.__table__.c.kind
    ids = requeue.retry_all_dead(model, column, name)
    if ids:
        _announce(kind, ids[0])  # one drain runs them all
    return ids


def wake_provider_waiters(now: datetime) -> int:
    """The provider answers again: work that was backing off for it (a refund during an outage,
    up to OUTBOX_PROVIDER_RETRY_CAP_SECONDS apart) runs now instead of at its next retry.
    Announced the way a commit announces its work (`queue.announce`: one drain for the
    deliveries, one pipeline for the commands), not a job per row. Returns how many it woke."""
    deliveries = requeue.wake_provider_waiters(OutboxDelivery, now)
    commands = requeue.wake_provider_waiters(ScheduledCommand, now)
    announce_or_leave_to_relay(
        lambda: queue.announce(deliveries, [(cid, now) for cid in commands], now=now),
        "%d rows waiting for the provider are due again",
        len(deliveries) + len(commands),
    )
    return len(deliveries) + len(commands)


def discard(kind: str, work_id: int, reason: str) -> bool:
    """Give up on a dead row for good, with the operator's reason. False when it was not dead
    or pending (any more)."""
    return requeue.discard(TABLES[kind], work_id, reason)
