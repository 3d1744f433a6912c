"""The connection and the names: the app's Redis client, its two RQ queues, rq-scheduler over the
work queue, the job function paths the jobs are stored under (what a job already in Redis
names must keep resolving: shop.jobs.*), and what a job in Redis may be.

Jobs are stored as JSON, never pickled: whoever can write to Redis must not be able to make a
process that reads a job run code of their choosing (docs/ARCHITECTURE.md, Jobs in Redis). Every
Queue, Job and Scheduler the shop builds comes from here (ShopQueue, ShopJob, the scheduler's
classes), so they all read and write the one SERIALIZER; `refusal` says why a job read from Redis
must not run."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from itertools import repeat
from typing import TypeVar

from flask import current_app
from redis import Redis
from rq import Queue
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer
from rq_scheduler import Scheduler
from rq_scheduler.utils import from_unix, rationalize_until

from ..extensions import per_app
from ..redis_client import redis_client

log = logging.getLogger("shop.queue")

DELIVERY_JOB = "shop.jobs.run_delivery"
COMMAND_JOB = "shop.jobs.run_command"
RELAY_JOB = "shop.jobs.relay"
SWEEP_JOB = "shop.jobs.reconcile"
DRAIN_JOB = "shop.jobs.drain"
COMMAND_DRAIN_JOB = "shop.jobs.drain_commands"
SWEEP_TAKEOVER_JOB = "shop.jobs.resume_sweep"
PRUNE_JOB = "shop.jobs.prune"

# The only functions a worker runs: shop.jobs' entry points, by the names jobs are stored under.
# A job naming anything else is refused before its function is imported (queue.worker).
ALLOWED_JOBS = frozenset(
    {DELIVERY_JOB, COMMAND_JOB, RELAY_JOB, SWEEP_JOB, DRAIN_JOB, COMMAND_DRAIN_JOB, SWEEP_TAKEOVER_JOB, PRUNE_JOB}
)

# Job data (function name, arguments), meta and results: JSON. Shop jobs carry ids, ints and None.
SERIALIZER = JSONSerializer


class ShopJob(Job):
    """An RQ job that reads and writes JSON whoever builds it: rq-scheduler creates and fetches
    jobs through its job class without passing a serializer."""

    def __init__(self, id=None, connection=None, serializer=None):
        super().__init__(id, connection=connection, serializer=serializer or SERIALIZER)


class ShopQueue(Queue):
    """An RQ queue of ShopJobs (JSON), also when RQ or rq-scheduler rebuilds it from its key."""

    job_class = ShopJob

    def __init__(self, *args, serializer=None, **kwargs):
        super().__init__(*args, serializer=serializer or SERIALIZER, **kwargs)


class ShopScheduler(Scheduler):
    """rq-scheduler over ShopJobs and ShopQueues (JSON). A scheduled job RQ cannot read at all
    (a forged hash) is logged and deleted where rq-scheduler would raise and stop the process."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("job_class", ShopJob)
        kwargs.setdefault("queue_class", ShopQueue)
        super().__init__(*args, **kwargs)

    def get_jobs(self, until=None, with_times=False, offset=None, length=None):
        # rq-scheduler 0.14's get_jobs, with a job that cannot be read refused instead of raised.
        found = self.connection.zrangebyscore(
            self.scheduled_jobs_key,
            0,
            rationalize_until(until),
            withscores=with_times,
            score_cast_func=lambda epoch: from_unix(float(epoch)),
            start=offset,
            num=length,
        )
        for job_id, at in found if with_times else zip(found, repeat(None)):
            job_id = job_id.decode()
            try:
                job = self.job_class.fetch(job_id, connection=self.connection)
            except NoSuchJobError:
                self.cancel(job_id)
                continue
            except Exception as exc:
                log.error("scheduler: refused scheduled job %s: RQ cannot read it (%r); deleted", job_id, exc)
                self.cancel(job_id)
                self.connection.delete(self.job_class.key_for(job_id))
                continue
            yield (job, at) if with_times else job


def refusal(job: Job) -> str | None:
    """Why `job` must not run, or None when it may: its data is not the JSON the shop writes, it
    names a function that is not one of shop.jobs' entry points, or it asks RQ to call anything
    besides (a method of an object, callbacks, webhooks). Reads only the job's fields and its
    JSON data; imports nothing."""
    func_name = instance = None  # read below, unless the job's data cannot be read
    try:
        func_name, instance = job.func_name, job.instance
        readable = isinstance(job.meta, dict) and "unserialized" not in job.meta
    except DeserializationError:
        readable = False
    if not readable:
        # Its description is plain text RQ writes beside the data: it names the function, as the
        # job's writer said it (nothing of the data is read to say so).
        said = (job.description or "")[:200]
        return f"its data is not JSON (pickled: an older release's job, or a forged one); it says it runs {said!r}"
    if func_name not in ALLOWED_JOBS or instance is not None:
        return f"it names {func_name!r}, which is not one of shop.jobs' entry points"
    callbacks = [job._success_callback_name, job._failure_callback_name, job._stopped_callback_name]
    if any(callbacks) or job.webhooks:
        return f"it names {func_name!r} with callbacks or webhooks, which shop jobs never carry"
    return None


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


T = TypeVar("T")


def once_redis_holds(step: Callable[[], T], say) -> T:
    """Run `step` (a process's start: what it writes to Redis) once Redis answers (wait_for_redis),
    and from the beginning again, once Redis answers again, when Redis fails during it. The start
    must be safe to repeat. A scheduler whose Redis goes away while it registers its periodic jobs
    waits for it, as it does once running, instead of exiting."""
    from redis.exceptions import RedisError

    while True:
        wait_for_redis(say)
        try:
            return step()
        except RedisError as exc:
            say(f"Redis failed during the start ({exc}); starting again once it answers")


def queue_names() -> tuple[str, str]:
    """(the control queue, the work queue): the app's two RQ queues, by its QUEUE_PREFIX."""
    prefix = current_app.config["QUEUE_PREFIX"]
    return f"{prefix}-control", f"{prefix}-work"


def work_queue() -> Queue:
    return ShopQueue(queue_names()[1], connection=redis_conn())


def control_queue() -> Queue:
    return ShopQueue(queue_names()[0], connection=redis_conn())


def scheduler() -> ShopScheduler:
    return ShopScheduler(
        queue=work_queue(), connection=redis_conn(), interval=current_app.config["SCHEDULER_POLL_SECONDS"]
    )


def aware(dt: datetime) -> datetime:
    # rq-scheduler treats naive datetimes as UTC; we always pass aware UTC to be explicit.
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
