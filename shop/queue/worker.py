"""The worker: RQ's non-forking worker with a heartbeat the health readings can rely on, that runs
shop.jobs' entry points and nothing else (docs/REFERENCE.md, Commands: `flask shop worker`)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from datetime import datetime, timezone

from redis.exceptions import RedisError
from rq import Queue, SimpleWorker, worker_registration
from rq.job import Job

from .. import failpoints, logs
from ..node import node_name
from .beats import Pulse, describe_job, heartbeat_seconds, iso, pulses_key
from .connection import SERIALIZER, ShopJob, ShopQueue, queue_names, redis_conn, refusal, wait_for_redis

log = logging.getLogger("shop.queue")

PUBSUB_WAKE_SECONDS = 1.0  # how often the control channel's thread looks whether it should stop


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
        self.pulse: Pulse | None = None  # started once registered (register_birth), not by a reader
        self.pulse_key = ""  # make_worker sets it: a worker made elsewhere does not pulse

    def register_birth(self):
        """RQ refuses to start under a name whose record says it is alive. This process's name is
        its node's and its pid's own, so such a record can only be one it left itself, when Redis
        failed during an earlier try at starting and kept its data (a Sentinel failover promotes a
        replica that has it), or one a dead process of the same pid on this node left (a container
        restarted within the record's expiry): never another live worker. Replace it."""
        failpoints.hit("worker.start.register_birth")
        if self.connection.exists(self.key) and not self.connection.hexists(self.key, "death"):
            log.warning("worker %s: replacing the record a failed start of this process left in Redis", self.name)
            self.connection.delete(self.key)
        super().register_birth()
        self._start_pulse()

    def subscribe(self):
        """RQ's subscription to its control channel, with the listening thread waking every
        second instead of every 60 s: RQ's teardown unsubscribes, then stops the thread and
        joins it, and a thread that read the unsubscription's reply first waits out its whole
        sleep for a subscription that never comes. A SIGTERM'd worker then took up to a minute
        to exit (past a platform's 30 s grace: SIGKILL), and so did every burst drain."""
        failpoints.hit("worker.start.subscribe")
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_WAKE_SECONDS, daemon=True, exception_handler=self._pubsub_exception_handler
        )
        failpoints.hit("worker.start.set_state")  # RQ's next step writes the first state

    def _start_pulse(self) -> None:
        """From the moment the worker is registered (and so counted as alive), it pulses: a worker
        stopped later in its start (subscribing, writing its first state) is then seen as stalled
        within the pulse's seconds, not only once its full beat is HEALTH_STALE_SECONDS old."""
        if self.pulse is None and self.pulse_key:
            pulse = Pulse(self.connection, self.pulse_key, self.name, self._vouched)
            pulse.beat()  # Redis failing here fails this try at starting; the next makes its own
            pulse.start()
            self.pulse = pulse

    def bootstrap(self, *args, **kwargs):
        super().bootstrap(*args, **kwargs)
        failpoints.hit("worker.start.listening")

    def _vouched(self) -> bool:
        """Idle, or running a job within its timeout: a job stuck past that is not vouched for."""
        job = self._job
        return job is None or time.monotonic() <= job[2]

    def register_death(self):
        if self.pulse is not None:
            self.pulse.stop()
        super().register_death()

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
    worker.pulse_key = pulses_key()
    return worker


def run_worker(burst: bool = False, name: str | None = None) -> None:
    """A non-forking worker: a fork per job would cost more than the jobs themselves, which are
    short, id-only and clean up their own session.

    Redis may go away at any moment: RQ waits for it inside its blocking dequeue, but a failure
    anywhere else (its start: the birth record, the pubsub channel, the first state; a beat or a
    suspension check between jobs; its teardown) ends RQ's `work()`, and a bare worker process
    would stay down. So a worker that ended without being asked to stop waits for Redis and starts
    again, as a new RQ worker under the same name (docs/REFERENCE.md, Commands: `flask shop worker`)."""
    while True:
        worker = make_worker(name)
        try:
            worker.work(burst=burst, with_scheduler=False, logging_level="WARNING")
        except RedisError as exc:
            log.warning("worker %s: Redis failed (%s); starting again once it answers", worker.name, exc)
        else:
            if burst or worker._shutdown_requested_date is not None:
                return
            log.warning("worker %s: RQ's loop ended without a stop request; starting again", worker.name)
            time.sleep(ShopWorker.max_connection_wait_time)  # a fault that repeats must not spin
        _let_go(worker)
        wait_for_redis(log.warning)


def _let_go(worker: ShopWorker) -> None:
    """What a worker that Redis failed under leaves behind: its pubsub thread (RQ's teardown stops
    it after recording the death, which failed too) and RQ's signal handlers, bound to it (a
    SIGTERM while the next one waits for Redis must end the process, not ask Redis the old one's
    state)."""
    if worker.pubsub_thread is not None:
        worker.pubsub_thread.stop()
        assert worker.pubsub is not None  # RQ subscribes before it starts the thread
        try:
            worker.pubsub.close()
        except (RedisError, OSError):
            pass
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
