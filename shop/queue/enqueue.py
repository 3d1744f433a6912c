"""Waking the work Redis runs: a committed transaction's deliveries and due commands wake a drain
of each kind; a command due later needs nothing from Redis (every scheduler asks the database
each poll for what fell due, see queue.watchful_scheduler), so arming a deadline costs no round
trip and a Redis that lost its data has nothing to re-arm."""

from __future__ import annotations

from datetime import datetime, timezone

from .connection import aware, work_queue
from .drain import Drain, drain_jobs


def wake(*kinds: Drain) -> None:
    """Wake a drain of each of `kinds` (unless enough of that kind already wait): two round
    trips, the slots and then the jobs."""
    jobs = drain_jobs(*kinds)
    if jobs:
        work_queue().enqueue_many(jobs)


def announce(delivery_ids, commands, now: datetime | None = None) -> None:
    """Hand committed work to Redis: deliveries by waking a delivery drain, commands already due
    (an email, a refund, an operator's retry) by waking a command drain. Nothing for commands
    due later: no round trip when a checkout only armed its deadline."""
    now = now or datetime.now(timezone.utc)
    kinds = [Drain.DELIVERIES] if delivery_ids else []
    if any(aware(due) <= now for _, due in commands):
        kinds.append(Drain.COMMANDS)
    if kinds:
        wake(*kinds)
