"""The connection and the names: the app's Redis client, its two RQ queues, rq-scheduler over the
work queue, and the job function paths the jobs are stored under (what a job already in Redis
names must keep resolving: shop.jobs.*)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from flask import current_app
from redis import Redis
from rq import Queue
from rq_scheduler import Scheduler

from ..extensions import per_app
from ..redis_client import redis_client

DELIVERY_JOB = "shop.jobs.run_delivery"
COMMAND_JOB = "shop.jobs.run_command"
RELAY_JOB = "shop.jobs.relay"
SWEEP_JOB = "shop.jobs.reconcile"
DRAIN_JOB = "shop.jobs.drain"
COMMAND_DRAIN_JOB = "shop.jobs.drain_commands"


def redis_conn() -> Redis:
    return per_app(
        "redis",
        lambda: redis_client(
            current_app.config["REDIS_URL"], socket_connect_timeout=2, socket_timeout=5, health_check_interval=30
        ),
    )


def wait_for_redis(say, *, every: float = 10.0) -> None:
    """Return once Redis answers. A worker or scheduler that starts while Redis restarts, or while
    Sentinel fails over to a replica, waits for it instead of exiting; `say` hears what it waits
    for, at once and then every `every` seconds."""
    from redis.exceptions import RedisError

    delay, said = 0.2, None
    while True:
        try:
            if redis_conn().ping():
                return
        except (RedisError, OSError) as exc:
            if said is None or time.monotonic() - said >= every:
                say(f"waiting for Redis (REDIS_URL) to answer: {exc}")
                said = time.monotonic()
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def queue_names() -> tuple[str, str]:
    """(the control queue, the work queue): the app's two RQ queues, by its QUEUE_PREFIX."""
    prefix = current_app.config["QUEUE_PREFIX"]
    return f"{prefix}-control", f"{prefix}-work"


def work_queue() -> Queue:
    return Queue(queue_names()[1], connection=redis_conn())


def control_queue() -> Queue:
    return Queue(queue_names()[0], connection=redis_conn())


def scheduler() -> Scheduler:
    return Scheduler(queue=work_queue(), connection=redis_conn(), interval=current_app.config["SCHEDULER_POLL_SECONDS"])


def aware(dt: datetime) -> datetime:
    # rq-scheduler treats naive datetimes as UTC; we always pass aware UTC to be explicit.
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
