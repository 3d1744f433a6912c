"""The worker: RQ's non-forking worker with a heartbeat the health readings can rely on, that runs
shop.jobs' entry points and nothing else (docs/REFERENCE.md, Commands: `flask shop worker`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import datetime, timezone

from redis.exceptions import RedisError
from rq import Queue, SimpleWorker, worker_registration
from rq.job import Job

from .beats import describe_job, heartbeat_seconds, iso
from .. import logs
from ..node import node_name
from .connection import SERIALIZER, ShopJob, ShopQueue, queue_names, redis_conn, refusal

log = logging.getLogger("shop.queue")


class ShopWorker(SimpleWorker):
    """RQ's non-forking worker, with a heartbeat HEALTH_STALE_SECONDS can rely on.

    RQ beats once per blocking dequeue, whose timeout is `worker_ttl - 15` (420 s by default):
    far too rarely. Here `worker_ttl` is chosen so the idle loop beats every heartbeat_seconds().
    A non-forking worker does not beat at all while a job runs (RQ's forking worker beats from
    the parent); a sweep asking the provider about 50 orders can run for a minute, so a thread
    beats for it, but only until the job's own timeout: a job stuck past that is no longer
    vouched for. SIGSTOP stops that thread with the rest, which is what a stalled worker is.

    Each beat also rewrites the worker's record and its registration (one pipeline, one round
    trip, as RQ's own beat): RQ registers a worker only at birth, so after Redis lost its data
    the worker would work on, invisible, for good. Our fields: what it runs now and since when,
    and its last job.

    A job is read as JSON and checked before anything of it runs (connection.refusal): one whose
    data is not JSON, or that names a function other than shop.jobs' entry points, is logged and
    deleted, its function never imported; so is one RQ cannot even read. The worker goes on."""

    # RQ waits 1, 2, 4 ... up to 60 s between tries while Redis does not answer, so a worker whose
    # Redis was away for half a minute (a restart, a slow Sentinel failover) could sleep a minute
    # more after it came back, every deadline and delivery of the node waiting with it. A try is
    # one connection attempt: every 2 s at most costs Redis nothing.
    max_connection_wait_time = 2.0

    def __init__(self, *args, beat_seconds: int = 15, **kwargs):
        kwargs.setdefault("worker_ttl", beat_seconds + 15)  # dequeue_timeout = worker_ttl - 15
        super().__init__(*args, **kwargs)
        self.beat_seconds = beat_seconds
        self._beat_lock = threading.Lock()
        self._job: tuple[str, datetime, float] | None = None  # what, since, vouched for until (monotonic)
        self._last_job: tuple[str, datetime] | None = None
        self._beater: threading.Thread | None = None

    def _record(self) -> dict:
        record = {
            "state": self.get_state(),
            "shop_job": "",
            "shop_job_since": "",
            "shop_last_job": "",
            "shop_last_job_at": "",
            "shop_host": socket.gethostname(),
        }
        if self.birth_date is not None and self.last_heartbeat is not None:
            record.update(self.serialize())
        if self._job is not None:
            record.update(shop_job=self._job[0], shop_job_since=iso(self._job[1]))
        if self._last_job is not None:
            record.update(shop_last_job=self._last_job[0], shop_last_job_at=iso(self._last_job[1]))
        return record

    def heartbeat(self, timeout: int | None = None, pipeline=None):
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            return
        with self._beat_lock, self.connection.pipeline() as pipe:
            # The whole record first, then RQ's beat (which sets the key's expiry: an EXPIRE before
            # the key exists again would leave it without one).
            pipe.hset(self.key, mapping=self._record())
            super().heartbeat(timeout, pipeline=pipe)
            worker_registration.register(self, pipe)
            pipe.execute()

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except Exception as exc:
                job_id = getattr(exc, "job_id", None)  # RQ names the job it could not read
                if job_id is None:
                    raise
                log.error("worker: refused job %s: RQ cannot read it (%r); deleted, not run", job_id, exc)
                self.connection.delete(ShopJob.key_for(job_id))

    def execute_job(self, job: Job, queue: Queue):
        why = refusal(job)
        if why is not None:
            log.error("worker: refused job %s: %s; deleted, not run", job.id, why)
            with self.connection.pipeline() as pipe:
                pipe.delete(job.key, job.dependents_key)
                pipe.lrem(queue.key, 0, job.id)
                pipe.execute()
            return
        ttl = int(job.timeout) if job.timeout and job.timeout > 0 else 300
        self._job = (describe_job(job), datetime.now(timezone.utc), time.monotonic() + ttl)
        if self._beater is None:
            self._beater = threading.Thread(target=self._beat_during_jobs, name="heartbeat", daemon=True)
            self._beater.start()
        scope = logs.enter(job_id=job.id)  # every line the job logs names it (LOG_FORMAT=json)
        try:
            super().execute_job(job, queue)
        except RedisError as exc:
            # Redis went away while RQ recorded the job's end (a Sentinel failover, a restart): the
            # job's work is in the database and RQ's own loop waits for Redis to come back. Letting
            # this escape would end the worker ("unhandled exception, quitting"), leaving the node
            # without one until something restarts it.
            log.warning("worker: Redis failed while job %s ended (%s); going on once it answers", job.id, exc)
            time.sleep(1)
        finally:
            logs.leave(scope)
            self._last_job, self._job = (self._job[0], datetime.now(timezone.utc)), None

    def _beat_during_jobs(self) -> None:
        while True:
            time.sleep(self.beat_seconds)
            job = self._job
            if (
                job is None
                or time.monotonic() > job[2]
                or (datetime.now(timezone.utc) - job[1]).total_seconds() < self.beat_seconds
            ):
                continue  # idle (the main loop beats), past its timeout, or too short to need it
            try:
                self.heartbeat()
            except Exception as exc:  # Redis away: the main loop will report it
                log.debug("worker heartbeat during a job failed: %s", exc)


class WorkerRecord(ShopWorker):
    """A worker as read from RQ's registry by another process (the web's /healthz, the console).
    RQ's constructor raises the connection's socket timeout to outlast a blocking dequeue; a
    reader never blocks, and /healthz must answer fast when Redis hangs: keep the app's timeout."""

    def _set_connection(self, connection):
        return connection


def make_worker(name: str | None = None) -> ShopWorker:
    """A worker of this node: its RQ name starts with the node (`node:backstop-pid`) and RQ's
    `hostname` field holds the node's name, which the console and /metrics group processes by;
    the machine's own host name is kept beside it (`shop_host`)."""
    control, work = queue_names()
    conn = redis_conn()
    node = node_name()
    worker = ShopWorker(
        [ShopQueue(control, connection=conn), ShopQueue(work, connection=conn)],
        connection=conn,
        serializer=SERIALIZER,
        job_class=ShopJob,
        queue_class=ShopQueue,
        name=name or f"{node}:backstop-{os.getpid()}",
        beat_seconds=heartbeat_seconds(),
    )
    worker.hostname = node
    return worker


def run_worker(burst: bool = False, name: str | None = None) -> None:
    """A non-forking worker: a fork per job would cost more than the jobs themselves, which are
    short, id-only and clean up their own session."""
    make_worker(name).work(burst=burst, with_scheduler=False, logging_level="WARNING")
