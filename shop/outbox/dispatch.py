"""Entry points that run one delivery or one scheduled command by id."""
from __future__ import annotations

from datetime import datetime

from ..domain.events import event_from_payload
from ..models import OutboxDelivery, ScheduledCommand
from . import runner


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


def run_delivery(delivery_id: int, now: datetime | None = None) -> str:
    return runner.run(OutboxDelivery, delivery_id, _execute_delivery, _describe_delivery, now)


def run_command(command_id: int, now: datetime | None = None) -> str:
    return runner.run(ScheduledCommand, command_id, _execute_command, _describe_command, now)
