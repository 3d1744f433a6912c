"""The only module that knows RQ's and rq-scheduler's API.

Jobs carry ids only; the rows they name are the source of truth. Redis is an accelerator: if
it loses everything, the relay (a periodic job) and the scheduler's start-up re-arm hand the
due rows to it again.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

from flask import current_app
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, SimpleWorker, get_current_job
from rq.job import Job
from rq_scheduler import Scheduler
from rq_scheduler.utils import to_unix

log = logging.getLogger("shop.queue")

DELIVERY_JOB = "shop.jobs.run_delivery"
COMMAND_JOB = "shop.jobs.run_command"
RELAY_JOB = "shop.jobs.relay"
SWEEP_JOB = "shop.jobs.reconcile"
DRAIN_JOB = "shop.jobs.drain"

# Deliveries are run by drain jobs, not one job each (RQ's own bookkeeping is ~28 round trips a
# job). At most DRAIN_SLOTS drains wait in the queue at once: announcing takes a free slot (a
# key, SET NX with a TTL so a lost drain cannot block the next for long) and enqueues a drain
# only then. A drain frees its slot as its first action, so work committed while it runs
# always finds a slot free and wakes another drain: no announcement is ever lost.
DRAIN_SLOTS = 2
DRAIN_SLOT_TTL_SECONDS = 30
_TAKE_SLOT = """
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, '1', 'NX', 'EX', tonumber(ARGV[1])) then return i end
end
return 0
"""

_conn_lock = threading.Lock()


def redis_conn() -> Redis:
    ext = current_app.extensions.setdefault("backstop", {})
    conn = ext.get("redis")
    if conn is None:
        with _conn_lock:
            conn = ext.get("redis")
            if conn is None:
                conn = Redis.from_url(current_app.config["REDIS_URL"], socket_connect_timeout=2,
                                      socket_timeout=5, health_check_interval=30)
                ext["redis"] = conn
    return conn


def _names():
    prefix = current_app.config["QUEUE_PREFIX"]
    return f"{prefix}-control", f"{prefix}-work"


def work_queue() -> Queue:
    return Queue(_names()[1], connection=redis_conn())


def control_queue() -> Queue:
    return Queue(_names()[0], connection=redis_conn())


def scheduler() -> Scheduler:
    return Scheduler(queue=work_queue(), connection=redis_conn(),
                     interval=current_app.config["SCHEDULER_POLL_SECONDS"])


def _aware(dt: datetime) -> datetime:
    # rq-scheduler treats naive datetimes as UTC; we always pass aware UTC to be explicit.
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def command_job_id(command_id: int) -> str:
    return f"{current_app.config['QUEUE_PREFIX']}-command-{command_id}"


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
        jobs = [_drain_job(slot)] if delivery_ids and (slot := _take_drain_slot()) is not None else []
        due_now = [(cid, due) for cid, due in commands if _aware(due) <= now]
        jobs += [Queue.prepare_data(COMMAND_JOB, args=(cid,), result_ttl=0, failure_ttl=3600, timeout=300)
                 for cid, _ in due_now]
        if jobs:
            queue.enqueue_many(jobs, pipeline=pipe)
        for cid, due in commands:
            if _aware(due) > now:
                job_id = command_job_id(cid)
                if running is not None and running.id == job_id:
                    # Re-armed from inside its own job (a retry, or a deadline that fired early): RQ
                    # deletes the running job's key when it finishes (result_ttl=0), which would take
                    # this schedule with it. A distinct id keeps it.
                    job_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
                # Scheduler.enqueue_at(), but into this pipeline: it is exactly _create_job (the
                # job hash, saved here instead of on its own) plus the zadd to the schedule.
                job = sched._create_job(COMMAND_JOB, args=(cid,), id=job_id, result_ttl=0, timeout=300,
                                        commit=False)
                job.save(pipeline=pipe)
                pipe.zadd(sched.scheduled_jobs_key, {job.id: to_unix(_aware(due))})
        for cid in retired:
            # A copy re-armed under a suffixed id (see above) stays; it finds its row obsolete and
            # does nothing, as does one already moved to the queue.
            pipe.zrem(sched.scheduled_jobs_key, command_job_id(cid))
            pipe.delete(Job.key_for(command_job_id(cid)))
        pipe.execute()


def _drain_key(slot: int) -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:drain-pending:{slot}"


def _take_drain_slot() -> int | None:
    """One round trip: the first free slot, now taken, or None when every slot has a drain
    waiting (which will see the work that was just committed)."""
    ext = current_app.extensions.setdefault("backstop", {})
    script = ext.get("take_drain_slot")
    if script is None:
        script = ext["take_drain_slot"] = redis_conn().register_script(_TAKE_SLOT)
    taken = script(keys=[_drain_key(i) for i in range(DRAIN_SLOTS)], args=[DRAIN_SLOT_TTL_SECONDS])
    return int(taken) - 1 if taken else None


def _drain_job_prefix() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}-drain-"


def _drain_job(slot: int | None):
    return Queue.prepare_data(DRAIN_JOB, args=(slot,), result_ttl=0, failure_ttl=3600, timeout=300,
                              job_id=f"{_drain_job_prefix()}{uuid.uuid4().hex}")


def request_drain(force: bool = False) -> bool:
    """Ask for a drain of due deliveries: when a slot is free, or always with `force` (the relay,
    which must not trust a slot whose drain Redis may have lost). Returns whether one was enqueued."""
    slot = None if force else _take_drain_slot()
    if slot is None and not force:
        return False
    work_queue().enqueue_many([_drain_job(slot)])
    return True


def drain_started(slot: int | None) -> None:
    """A drain's first action: free its slot, so anything announced from now on wakes the next."""
    if slot is not None:
        redis_conn().delete(_drain_key(slot))


def other_jobs_waiting() -> bool:
    """Is anything but another drain queued for this worker (a command at its time, a retry, a
    relay)? A drain then hands the worker back between batches. (Yielding to a waiting drain
    would only pass the same work around.) One round trip."""
    control, work = _names()
    with redis_conn().pipeline(transaction=False) as pipe:
        pipe.llen(f"{Queue.redis_queue_namespace_prefix}{control}")
        pipe.lrange(f"{Queue.redis_queue_namespace_prefix}{work}", 0, DRAIN_SLOTS)
        control_waiting, head = pipe.execute()
    drain = _drain_job_prefix().encode()
    return bool(control_waiting) or any(not job_id.startswith(drain) for job_id in head)


def command_is_scheduled(command_id: int) -> bool:
    return command_job_id(command_id) in scheduler()


def register_periodic_jobs(relay_seconds: int, sweep_seconds: int | None) -> list[str]:
    """Declare the periodic jobs with deterministic ids. Re-registering is idempotent, and a
    changed interval replaces the old registration."""
    sched = scheduler()
    prefix = current_app.config["QUEUE_PREFIX"]
    ids = periodic_job_ids(bool(sweep_seconds))
    wanted = {ids[0]: (RELAY_JOB, relay_seconds)}
    if sweep_seconds:
        wanted[ids[1]] = (SWEEP_JOB, sweep_seconds)
    existing = {job.id: job for job in sched.get_jobs() if job.id.startswith(f"{prefix}-periodic-")}
    done = []
    for job_id, job in existing.items():
        if job_id not in wanted or job.meta.get("interval") != wanted[job_id][1] or job.func_name != wanted[job_id][0]:
            sched.cancel(job)
            job.delete()
    for job_id, (func, interval) in wanted.items():
        if job_id in sched and job_id in existing and existing[job_id].meta.get("interval") == interval:
            done.append(f"{job_id} (kept, every {interval}s)")
            continue
        # result_ttl=-1 keeps the job's key: with 0 the worker deletes it after the first run and
        # rq-scheduler then drops the repeat as a job that no longer exists.
        sched.schedule(datetime.now(timezone.utc), func, interval=interval, repeat=None, id=job_id,
                       queue_name=_names()[0], result_ttl=-1, timeout=max(60, interval * 2))
        done.append(f"{job_id} (registered, every {interval}s)")
    return done


def enqueue_control(func_path: str, *args) -> None:
    control_queue().enqueue(func_path, *args, result_ttl=0, failure_ttl=3600)


def enqueue_delivery(delivery_id: int) -> None:
    # job_timeout, not timeout: Queue.enqueue hands unknown keywords to the job function itself.
    work_queue().enqueue(DELIVERY_JOB, delivery_id, result_ttl=0, failure_ttl=3600, job_timeout=300)


def enqueue_command(command_id: int, due: datetime | None = None) -> None:
    announce([], [(command_id, due or datetime.now(timezone.utc))])


def run_worker(burst: bool = False, name: str | None = None) -> None:
    """A non-forking worker: the fork per job costs ~12 ms here, which caps a forking worker
    near 70 jobs/s; the jobs are short, id-only and clean up their own session."""
    control, work = _names()
    conn = redis_conn()
    worker = SimpleWorker([Queue(control, connection=conn), Queue(work, connection=conn)], connection=conn,
                          name=name or f"backstop-{socket.gethostname()}-{os.getpid()}")
    worker.work(burst=burst, with_scheduler=False, logging_level="WARNING")


class _WatchfulScheduler(Scheduler):
    """rq-scheduler that notices Redis losing its data while it runs (a restart without
    persistence, a FLUSHDB, an eviction). The periodic jobs live in Redis and are what would
    otherwise notice, so their absence is the sign: on a poll where one is missing, `on_loss`
    rebuilds Redis's part from the database before due jobs are moved. One ZSCORE per periodic
    job per poll; only the scheduler holding rq-scheduler's lock does it."""

    def __init__(self, *args, watch=(), on_loss=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._watch = tuple(watch)
        self._on_loss = on_loss

    def run(self, burst: bool = False):
        """rq-scheduler's loop, kept alive through a Redis outage: a restart or a network blip
        is waited out (the next poll then finds whatever Redis lost) instead of ending the
        process with a traceback."""
        while True:
            try:
                return super().run(burst=burst)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if burst:
                    raise
                log.warning("scheduler: Redis unreachable (%s); waiting for it", exc)
                self._wait_for_redis()
                # Our birth record may have outlived a blip (Redis kept its data): it is ours,
                # and run() refuses to start while a live-looking scheduler of our name exists.
                self.connection.delete(self.key)
                log.warning("scheduler: Redis answers again; resuming")

    def _wait_for_redis(self, pause: float = 1.0) -> None:
        while True:
            try:
                self.connection.ping()
                return
            except (RedisConnectionError, RedisTimeoutError):
                time.sleep(pause)

    def enqueue_jobs(self):
        if self._on_loss is not None and self._watch:
            pipe = self.connection.pipeline(transaction=False)
            for job_id in self._watch:
                pipe.zscore(self.scheduled_jobs_key, job_id)
            if any(score is None for score in pipe.execute()):
                self._on_loss()
        return super().enqueue_jobs()


def periodic_job_ids(with_sweep: bool) -> list[str]:
    prefix = current_app.config["QUEUE_PREFIX"]
    return [f"{prefix}-periodic-relay"] + ([f"{prefix}-periodic-reconcile"] if with_sweep else [])


def run_scheduler(burst: bool = False, watch=(), on_loss=None) -> None:
    """Poll until stopped. `watch`: periodic job ids whose disappearance means Redis lost its
    data; `on_loss` is then called to rebuild from the database."""
    _WatchfulScheduler(queue=work_queue(), connection=redis_conn(),
                       interval=current_app.config["SCHEDULER_POLL_SECONDS"],
                       watch=watch, on_loss=on_loss).run(burst=burst)


def ping() -> bool:
    return bool(redis_conn().ping())
