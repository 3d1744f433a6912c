"""The periodic jobs (the relay and the sweep), registered with rq-scheduler under deterministic
ids, when it will next run one, and a sweep cycle asked for out of turn (`request_sweep_takeover`)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from flask import current_app
from rq_scheduler import Scheduler

from .connection import (
    RELAY_JOB,
    SWEEP_JOB,
    SWEEP_TAKEOVER_JOB,
    control_queue,
    queue_names,
    redis_conn,
    refusal,
    scheduler,
)

log = logging.getLogger("shop.queue")
# At most one takeover job is queued per this many seconds, however many schedulers poll.
SWEEP_TAKEOVER_EVERY = 2


def register_periodic_jobs(relay_seconds: int, sweep_seconds: int | None) -> list[str]:
    """Declare the periodic jobs with deterministic ids. Re-registering is idempotent, and a
    changed interval replaces the old registration, as does one this release cannot read (an
    older release's pickled job: logged, deleted and registered again as JSON)."""
    sched = scheduler()
    prefix = current_app.config["QUEUE_PREFIX"]
    ids = periodic_job_ids(bool(sweep_seconds))
    wanted = {ids[0]: (RELAY_JOB, relay_seconds)}
    if sweep_seconds:
        wanted[ids[1]] = (SWEEP_JOB, sweep_seconds)
    existing = {job.id: job for job in sched.get_jobs() if job.id.startswith(f"{prefix}-periodic-")}
    done = []
    for job_id, job in list(existing.items()):
        why = refusal(job)
        if why is not None:
            log.warning("periodic job %s refused (%s): deleting it and registering it again", job_id, why)
            sched.cancel(job)
            redis_conn().delete(job.key)  # as it is: RQ's delete would read and rewrite it
            del existing[job_id]
        elif job_id not in wanted or (job.func_name, job.meta.get("interval")) != wanted[job_id]:
            sched.cancel(job)
            job.delete()
    for job_id, (func, interval) in wanted.items():
        if job_id in sched and job_id in existing and existing[job_id].meta.get("interval") == interval:
            done.append(f"{job_id} (kept, every {interval}s)")
            continue
        # result_ttl=-1 keeps the job's key: with 0 the worker deletes it after the first run and
        # rq-scheduler then drops the repeat as a job that no longer exists.
        sched.schedule(
            datetime.now(timezone.utc),
            func,
            interval=interval,
            repeat=None,
            id=job_id,
            queue_name=queue_names()[0],
            result_ttl=-1,
            timeout=max(60, interval * 2),
        )
        done.append(f"{job_id} (registered, every {interval}s)")
    return done


def periodic_job_ids(with_sweep: bool) -> list[str]:
    prefix = current_app.config["QUEUE_PREFIX"]
    return [f"{prefix}-periodic-relay"] + ([f"{prefix}-periodic-reconcile"] if with_sweep else [])


def next_run_at(job_id: str) -> datetime | None:
    """When rq-scheduler will next move a (periodic) job: the sweep's next cycle."""
    score = redis_conn().zscore(Scheduler.scheduled_jobs_key, job_id)
    return datetime.fromtimestamp(score, timezone.utc) if score is not None else None


def request_sweep_takeover(sweep_seconds: int) -> bool:
    """Queue one cycle now, for a sweep lease left behind mid-cycle (its holder died or froze):
    the periodic job would only come back an interval later. Every scheduler polls, so a key set
    with NX lets one request through every SWEEP_TAKEOVER_EVERY seconds; the job itself looks
    again before it runs a cycle. True when a job was queued."""
    prefix = current_app.config["QUEUE_PREFIX"]
    if not redis_conn().set(f"{prefix}-sweep-takeover", "1", nx=True, ex=SWEEP_TAKEOVER_EVERY):
        return False
    control_queue().enqueue(SWEEP_TAKEOVER_JOB, result_ttl=0, failure_ttl=3600, job_timeout=max(60, sweep_seconds * 2))
    return True
