"""Entry points that run deliveries and scheduled commands: one by id, or deliveries in drains."""
from __future__ import annotations

from datetime import datetime
from typing import Callable

from sqlalchemy.orm import joinedload

from ..domain.events import event_from_payload
from ..models import OutboxDelivery, ScheduledCommand
from . import runner

# A drain claims this many deliveries per statement and hands the worker back to other jobs
# (scheduled commands keep their time) after this long.
DRAIN_BATCH_SIZE = 20
DRAIN_BUDGET_SECONDS = 2.0


def _handlers():
    from ..saga import HANDLERS

    return HANDLERS


def _commands():
    from ..scheduling.commands import COMMANDS

    return COMMANDS


def _describe_delivery(row) -> str:
    return f"delivery {row.id} ({row.event.name if row.event else '?'} -> {row.handler}, order {row.order_id})"


def _describe_command(row) -> str:
    return f"command {row.id} ({row.kind}, order {row.order_id})"


def _execute_delivery(row: OutboxDelivery, now: datetime) -> None:
    handler = _handlers().get(row.handler)
    if handler is None:
        raise runner.PermanentFailure(f"no handler named {row.handler!r}")
    handler(event_from_payload(row.event.name, row.event.payload), now)


def _execute_command(row: ScheduledCommand, now: datetime) -> None:
    command = _commands().get(row.kind)
    if command is None:
        raise runner.PermanentFailure(f"no command named {row.kind!r}")
    command(row, now)


DELIVERIES = runner.Work(OutboxDelivery, _execute_delivery, _describe_delivery,
                         load_options=(joinedload(OutboxDelivery.event),))
COMMANDS = runner.Work(ScheduledCommand, _execute_command, _describe_command,
                       early_claim_seconds=runner.EARLY_CLAIM_SECONDS)


def run_delivery(delivery_id: int, now: datetime | None = None) -> str:
    return runner.run(DELIVERIES, delivery_id, now)


def run_command(command_id: int, now: datetime | None = None) -> str:
    return runner.run(COMMANDS, command_id, now)


def drain_deliveries(now: datetime | None = None, should_yield: Callable[[], bool] | None = None,
                     batch_size: int | None = None, budget_seconds: float | None = None) -> dict:
    """Run every due delivery (pending and due, or with a lapsed lease), a batch at a time."""
    return runner.drain(DELIVERIES, batch_size=batch_size or DRAIN_BATCH_SIZE,
                        budget_seconds=DRAIN_BUDGET_SECONDS if budget_seconds is None else budget_seconds,
                        now=now, should_yield=should_yield)
