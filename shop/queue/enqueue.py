"""Handing work to Redis: deliveries (a drain, or a delivery's own job), commands at their
time, and the deadlines an order no longer needs taken off rq-scheduler's schedule."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from rq import Queue, get_current_job
from rq.job import Job
from rq_scheduler import Scheduler
from rq_scheduler.utils import to_unix

from .connection import COMMAND_JOB, DELIVERY_JOB, aware, command_job_id, redis_conn, scheduler, work_queue
from .drain import drain_job, take_drain_slot


def announce(delivery_ids, commands, now: datetime | None = None, retired=()) -> None:
    """Hand committed work to Redis: deliveries by waking a drain (unless enough drains already
    wait), commands at their time, and take `retired` commands (deadlines of an order that
    reached a final state) off rq-scheduler's schedule. One pipeline (one round trip) for the
    jobs: a checkout's deadline included; deliveries add the round trip that takes a drain slot."""
    if not delivery_ids and not commands and not retired:
        return
    now = now or datetime.now(timezone.utc)
    queue = work_queue()
    sched = scheduler()
    running = get_current_job()
    with redis_conn().pipeline() as pipe:
        jobs = [drain_job(slot)] if delivery_ids and (slot := take_drain_slot()) is not None else []
        due_now = [(cid, due) for cid, due in commands if aware(due) <= now]
        jobs += [
            Queue.prepare_data(COMMAND_JOB, args=(cid,), result_ttl=0, failure_ttl=3600, timeout=300)
            for cid, _ in due_now
        ]
        if jobs:
            queue.enqueue_many(jobs, pipeline=pipe)
        for cid, due in commands:
            if aware(due) > now:
                job_id = command_job_id(cid)
                if running is not None and running.id == job_id:
                    # Re-armed from inside its own job (a retry, or a deadline that fired early): RQ
                    # deletes the running job's key when it finishes (result_ttl=0), which would take
                    # this schedule with it. A distinct id keeps it.
                    job_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
                _schedule_in_pipeline(sched, pipe, COMMAND_JOB, (cid,), job_id, due)
        for cid in retired:
            # A copy re-armed under a suffixed id (see above) stays; it finds its row obsolete and
            # does nothing, as does one already moved to the queue.
            pipe.zrem(sched.scheduled_jobs_key, command_job_id(cid))
            pipe.delete(Job.key_for(command_job_id(cid)))
        pipe.execute()


def _schedule_in_pipeline(sched: Scheduler, pipe, func: str, args: tuple, job_id: str, due: datetime) -> None:
    """`Scheduler.enqueue_at()`, but into the caller's pipeline, so a commit's deadlines reach
    Redis in one round trip. rq-scheduler 0.14 (its last release, pinned in pyproject.toml) has
    no public way to build a scheduled job without saving it: `_create_job(commit=False)` is
    exactly enqueue_at's first half (the job hash, with the scheduler's origin and queue class),
    saved here into the pipeline, plus the zadd that is its second half. This is the one place
    the shop reaches into rq-scheduler's private API; an upgrade that changes it fails here."""
    job = sched._create_job(func, args=args, id=job_id, result_ttl=0, timeout=300, commit=False)
    job.save(pipeline=pipe)
    pipe.zadd(sched.scheduled_jobs_key, {job.id: to_unix(aware(due))})


def command_is_scheduled(command_id: int) -> bool:
    return command_job_id(command_id) in scheduler()


def enqueue_delivery(delivery_id: int) -> None:
    # job_timeout, not timeout: Queue.enqueue hands unknown keywords to the job function itself.
    work_queue().enqueue(DELIVERY_JOB, delivery_id, result_ttl=0, failure_ttl=3600, job_timeout=300)


def schedule_delivery(delivery_id: int, due: datetime) -> None:
    """A delivery's retry, run at `due`. rq-scheduler keeps whole seconds and may fire a second
    early; a delivery is never claimed before its time, so the job is scheduled a second late."""
    scheduler().enqueue_at(aware(due) + timedelta(seconds=1), DELIVERY_JOB, delivery_id, job_result_ttl=0, timeout=300)


def enqueue_command(command_id: int, due: datetime | None = None) -> None:
    announce([], [(command_id, due or datetime.now(timezone.utc))])
