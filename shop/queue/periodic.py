"""The periodic jobs (the relay, the sweep and the prune), registered with rq-scheduler under
deterministic ids, when it will next run one, a sweep cycle asked for out of turn
(`request_sweep_takeover`), and the continuation of a prune that handed its worker back
(`request_prune`)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from flask import current_app
from rq import Queue
from rq.job import Job
from rq_scheduler import Scheduler

from .connection import (
    PRUNE_JOB,
    RELAY_JOB,
    SWEEP_JOB,
    SWEEP_TAKEOVER_JOB,
    control_queue,
    queue_names,
    redis_conn,
    refusal,
    scheduler,
    work_queue,
)

log = logging.getLogger("shop.queue")
# At most one takeover job is queued per this many seconds, however many schedulers poll.
SWEEP_TAKEOVER_EVERY = 2


def register_periodic_jobs(
    relay_seconds: int, sweep_seconds: int | None, prune_seconds: int | None = None
) -> list[str]:
    """Declare the periodic jobs with deterministic ids. Re-registering is idempotent, and a
    changed interval replaces the old registration, as does one this release cannot read (an
    older release's pickled job: logged, deleted and registered again as JSON). A job not wanted
    any more (the sweep with both its gates off, the prune when not asked for) is removed."""
    sched = scheduler()
    prefix = current_app.config["QUEUE_PREFIX"]
    relay_id, sweep_id, prune_id = _ids(prefix)
    wanted = {relay_id: (RELAY_JOB, relay_seconds)}
    if sweep_seconds:
        wanted[sweep_id] = (SWEEP_JOB, sweep_seconds)
    if prune_seconds:
        wanted[prune_id] = (PRUNE_JOB, prune_seconds)
    # Without with_times, get_jobs yields the jobs alone.
    jobs = [job for job in sched.get_jobs() if isinstance(job, Job)]
    existing = {job.id: job for job in jobs if job.id.startswith(f"{prefix}-periodic-")}
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


def _ids(prefix: str) -> tuple[str, str, str]:
    return f"{prefix}-periodic-relay", f"{prefix}-periodic-reconcile", f"{prefix}-periodic-prune"


def periodic_job_ids(with_sweep: bool, with_prune: bool = False) -> list[str]:
    """[relay, sweep (when wanted), prune (when wanted)]."""
    relay_id, sweep_id, prune_id = _ids(current_app.config["QUEUE_PREFIX"])
    return [relay_id] + ([sweep_id] if with_sweep else []) + ([prune_id] if with_prune else [])


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


def _prune_again_key() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}-prune-again"


def request_prune() -> bool:
    """Queue one more prune at the back of the work queue, for a run that handed its worker back
    with rows left (its time was up, or other jobs were waiting): the rest goes on after them
    instead of an interval later. At most one is queued at a time (a key set NX, cleared when a
    prune starts; its TTL frees it should Redis lose the job). True when a job was queued."""
    if not redis_conn().set(_prune_again_key(), "1", nx=True, ex=600):
        return False
    work_queue().enqueue(PRUNE_JOB, result_ttl=0, failure_ttl=3600, job_timeout=600)
    return True


def prune_started() -> None:
    """A prune's first action: from now on a continuation may be queued again."""
    redis_conn().delete(_prune_again_key())


def jobs_waiting() -> bool:
    """Is any job queued for the workers at all? The prune, the least urgent work there is, hands
    its worker back between batches as soon as anything waits (a drain included). One round trip."""
    control, work = queue_names()
    with redis_conn().pipeline(transaction=False) as pipe:
        pipe.llen(f"{Queue.redis_queue_namespace_prefix}{control}")
        pipe.llen(f"{Queue.redis_queue_namespace_prefix}{work}")
        return any(pipe.execute())
