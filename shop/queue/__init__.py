"""The only package that knows RQ's and rq-scheduler's API.

Jobs carry ids only; the rows they name are the source of truth. Redis is an accelerator: if
it loses everything, the relay (a periodic job) and the scheduler's start-up re-arm hand the
due rows to it again.

  connection          the Redis client, the two RQ queues, rq-scheduler, the job names (shop.jobs.*),
                      JSON job data and the jobs a worker may run (`refusal`)
  enqueue             waking the drains for committed work (`announce`)
  drain               drain slots, per kind: at most DRAIN_SLOTS drains wait; a drain frees its slot first
  payment_wake        waking the payment queue when an order joins its line
  periodic            the relay's, the sweep's and the prune's periodic jobs; a sweep cycle out of
                      turn; a prune's continuation
  beats               heartbeats: how often, and how they are written
  worker              the worker (`run_worker`)
  watchful_scheduler  the scheduler (`run_scheduler`): asks the database each poll for due work,
                      and notices Redis losing its data
  health              what Redis knows of the processes and queues

The names the rest of the shop calls are re-exported here: callers say `queue.announce(...)`.
"""

from .connection import (
    ALLOWED_JOBS,
    COMMAND_DRAIN_JOB,
    COMMAND_JOB,
    DELIVERY_JOB,
    DRAIN_JOB,
    PRUNE_JOB,
    RELAY_JOB,
    SWEEP_JOB,
    control_queue,
    once_redis_holds,
    queue_names,
    redis_conn,
    scheduler,
    wait_for_redis,
    work_queue,
)
from .drain import DRAIN_SLOTS, Drain, drain_started, other_jobs_waiting, request_drain, waker
from .enqueue import announce, wake
from .health import ping, processes, pulses, queue_depths
from .payment_wake import wait_for_payment_queue, wake_payment_queue
from .periodic import (
    jobs_waiting,
    next_run_at,
    periodic_job_ids,
    prune_started,
    register_periodic_jobs,
    request_prune,
    request_sweep_takeover,
)
from .watchful_scheduler import make_scheduler, run_scheduler
from .worker import make_worker, run_worker

__all__ = [
    "ALLOWED_JOBS",
    "COMMAND_DRAIN_JOB",
    "COMMAND_JOB",
    "DELIVERY_JOB",
    "DRAIN_JOB",
    "DRAIN_SLOTS",
    "Drain",
    "PRUNE_JOB",
    "RELAY_JOB",
    "SWEEP_JOB",
    "announce",
    "control_queue",
    "drain_started",
    "jobs_waiting",
    "make_scheduler",
    "make_worker",
    "next_run_at",
    "other_jobs_waiting",
    "periodic_job_ids",
    "ping",
    "processes",
    "pulses",
    "prune_started",
    "queue_depths",
    "queue_names",
    "redis_conn",
    "register_periodic_jobs",
    "request_drain",
    "request_prune",
    "request_sweep_takeover",
    "run_scheduler",
    "run_worker",
    "scheduler",
    "wait_for_payment_queue",
    "once_redis_holds",
    "wait_for_redis",
    "wake",
    "wake_payment_queue",
    "waker",
    "work_queue",
]
