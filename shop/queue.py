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
from datetime import datetime, timedelta, timezone

from flask import current_app
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, SimpleWorker, get_current_job, worker_registration
from rq.job import Job
from rq_scheduler import Scheduler
from rq_scheduler.utils import to_unix
from .extensions import per_app

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


def redis_conn() -> Redis:
    return per_app(
        "redis",
        lambda: Redis.from_url(
            current_app.config["REDIS_URL"], socket_connect_timeout=2, socket_timeout=5, health_check_interval=30
        ),
    )


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
        jobs += [
            Queue.prepare_data(COMMAND_JOB, args=(cid,), result_ttl=0, failure_ttl=3600, timeout=300)
            for cid, _ in due_now
        ]
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
    pipe.zadd(sched.scheduled_jobs_key, {job.id: to_unix(_aware(due))})


def _drain_key(slot: int) -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:drain-pending:{slot}"


def _take_drain_slot() -> int | None:
    """One round trip: the first free slot, now taken, or None when every slot has a drain
    waiting (which will see the work that was just committed)."""
    script = per_app("take_drain_slot", lambda: redis_conn().register_script(_TAKE_SLOT))
    taken = script(keys=[_drain_key(i) for i in range(DRAIN_SLOTS)], args=[DRAIN_SLOT_TTL_SECONDS])
    return int(taken) - 1 if taken else None


def _drain_job_prefix() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}-drain-"


def _drain_job(slot: int | None):
    return Queue.prepare_data(
        DRAIN_JOB,
        args=(slot,),
        result_ttl=0,
        failure_ttl=3600,
        timeout=300,
        job_id=f"{_drain_job_prefix()}{uuid.uuid4().hex}",
    )


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


def _payment_queue_key() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:payment-queue:wake"


def wake_payment_queue() -> None:
    """An order joined the line for a payment session: wake the payment queue now rather than at
    its next look at the database (payments.checkout_queue). One round trip; the list never holds
    more than a few wake-ups."""
    with redis_conn().pipeline(transaction=False) as pipe:
        pipe.lpush(_payment_queue_key(), 1)
        pipe.ltrim(_payment_queue_key(), 0, 3)
        pipe.expire(_payment_queue_key(), 60)
        pipe.execute()


def wait_for_payment_queue(timeout: float) -> bool:
    """Block until an order joins the line or `timeout` seconds pass; True when woken. A wake-up
    lost with Redis's data only costs the timeout."""
    conn = redis_conn()
    woken = conn.blpop([_payment_queue_key()], timeout=max(0.01, timeout))
    if woken:
        conn.delete(_payment_queue_key())  # the others say the same thing
    return bool(woken)


def other_jobs_waiting() -> bool:
    """Is anything but another drain queued for this worker (a command at its time, a retry, a
    relay)? A drain then hands the worker back between batches. (Yielding to a waiting drain
    would only pass the same work around.) One round trip."""
    control, work = queue_names()
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


def enqueue_delivery(delivery_id: int) -> None:
    # job_timeout, not timeout: Queue.enqueue hands unknown keywords to the job function itself.
    work_queue().enqueue(DELIVERY_JOB, delivery_id, result_ttl=0, failure_ttl=3600, job_timeout=300)


def schedule_delivery(delivery_id: int, due: datetime) -> None:
    """A delivery's retry, run at `due`. rq-scheduler keeps whole seconds and may fire a second
    early; a delivery is never claimed before its time, so the job is scheduled a second late."""
    scheduler().enqueue_at(_aware(due) + timedelta(seconds=1), DELIVERY_JOB, delivery_id, job_result_ttl=0, timeout=300)


def enqueue_command(command_id: int, due: datetime | None = None) -> None:
    announce([], [(command_id, due or datetime.now(timezone.utc))])


def heartbeat_seconds() -> int:
    """How often a worker or the scheduler leaves a heartbeat: four beats per HEALTH_STALE_SECONDS
    (every 15 s at the default of 60, every second at the smallest), so one late beat never
    makes a healthy process look stalled."""
    return max(1, min(15, current_app.config["HEALTH_STALE_SECONDS"] // 4))


def _iso(ts: datetime | None) -> str:
    return ts.astimezone(timezone.utc).isoformat() if ts is not None else ""


def _describe_job(job: Job) -> str:
    return f"{job.func_name.rsplit('.', 1)[-1]}({', '.join(map(str, job.args or ()))})"


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
    and its last job."""

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
        }
        if self.birth_date is not None and self.last_heartbeat is not None:
            record.update(self.serialize())
        if self._job is not None:
            record.update(shop_job=self._job[0], shop_job_since=_iso(self._job[1]))
        if self._last_job is not None:
            record.update(shop_last_job=self._last_job[0], shop_last_job_at=_iso(self._last_job[1]))
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

    def execute_job(self, job: Job, queue: Queue):
        ttl = int(job.timeout) if job.timeout and job.timeout > 0 else 300
        self._job = (_describe_job(job), datetime.now(timezone.utc), time.monotonic() + ttl)
        if self._beater is None:
            self._beater = threading.Thread(target=self._beat_during_jobs, name="heartbeat", daemon=True)
            self._beater.start()
        try:
            super().execute_job(job, queue)
        finally:
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


class _WorkerRecord(ShopWorker):
    """A worker as read from RQ's registry by another process (the web's /healthz, the console).
    RQ's constructor raises the connection's socket timeout to outlast a blocking dequeue; a
    reader never blocks, and /healthz must answer fast when Redis hangs: keep the app's timeout."""

    def _set_connection(self, connection):
        return connection


def make_worker(name: str | None = None) -> ShopWorker:
    control, work = queue_names()
    conn = redis_conn()
    return ShopWorker(
        [Queue(control, connection=conn), Queue(work, connection=conn)],
        connection=conn,
        name=name or f"backstop-{socket.gethostname()}-{os.getpid()}",
        beat_seconds=heartbeat_seconds(),
    )


def run_worker(burst: bool = False, name: str | None = None) -> None:
    """A non-forking worker: the fork per job costs ~12 ms here, which caps a forking worker
    near 70 jobs/s; the jobs are short, id-only and clean up their own session."""
    make_worker(name).work(burst=burst, with_scheduler=False, logging_level="WARNING")


class _WatchfulScheduler(Scheduler):
    """rq-scheduler that notices Redis losing its data while it runs (a restart without
    persistence, a FLUSHDB, an eviction). The periodic jobs live in Redis and are what would
    otherwise notice, so their absence is the sign: on a poll where one is missing, `on_loss`
    rebuilds Redis's part from the database before due jobs are moved. One ZSCORE per periodic
    job per poll; only the scheduler holding rq-scheduler's lock does it."""

    def __init__(
        self, *args, watch=(), on_loss=None, beat_key: str = "", beat_index: str = "", beat_ttl: int = 180, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self._watch = tuple(watch)
        self._on_loss = on_loss
        self.beat_name = self.name_here()
        self._beat_key, self._beat_index, self._beat_ttl = beat_key, beat_index, beat_ttl
        self._born = datetime.now(timezone.utc)
        self._last_moved: tuple[str, datetime] | None = None
        self._last_lock_at: datetime | None = None

    @staticmethod
    def name_here() -> str:
        """This process's scheduler, as its heartbeat names it."""
        return f"scheduler-{socket.gethostname()}-{os.getpid()}"

    def heartbeat(self):
        """rq-scheduler's own beat only extends its key's expiry (no time, nothing to read): ours
        writes who and what, and when, each poll, in the same round trip. The record is written
        whole each time, so after Redis lost its data it is back at the next poll."""
        now = datetime.now(timezone.utc)
        if self._lock_acquired:
            self._last_lock_at = now
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.expire(self.key, int(self._interval) + 10)
            if self._beat_key:
                pipe.hset(
                    self._beat_key,
                    mapping={
                        "name": self.beat_name,
                        "host": socket.gethostname(),
                        "pid": os.getpid(),
                        "runs": f"rq-scheduler for {self.queue_name}, polling every {self._interval} s",
                        "since": _iso(self._born),
                        "last_beat": _iso(now),
                        "last_job": self._last_moved[0] if self._last_moved else "",
                        "last_job_at": _iso(self._last_moved[1]) if self._last_moved else "",
                        "last_lock_at": _iso(self._last_lock_at),
                    },
                )
                pipe.expire(self._beat_key, self._beat_ttl)
                pipe.zadd(self._beat_index, {self.beat_name: now.timestamp()})
            pipe.execute()

    def enqueue_job(self, job):
        self._last_moved = (_describe_job(job), datetime.now(timezone.utc))
        return super().enqueue_job(job)

    def register_death(self):
        """A clean stop is not a stall: the heartbeat goes with the process."""
        super().register_death()
        if self._beat_key:
            with self.connection.pipeline(transaction=False) as pipe:
                pipe.delete(self._beat_key)
                pipe.zrem(self._beat_index, self.beat_name)
                pipe.execute()

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


def _scheduler_beats_key() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:heartbeats:scheduler"


def make_scheduler(watch=(), on_loss=None) -> _WatchfulScheduler:
    # The record outlives a stall for a while (so the console can name the stalled scheduler);
    # the index keeps its last beat time for a day after that.
    return _WatchfulScheduler(
        queue=work_queue(),
        connection=redis_conn(),
        interval=current_app.config["SCHEDULER_POLL_SECONDS"],
        watch=watch,
        on_loss=on_loss,
        beat_key=f"{_scheduler_beats_key()}:{_WatchfulScheduler.name_here()}",
        beat_index=_scheduler_beats_key(),
        beat_ttl=3 * current_app.config["HEALTH_STALE_SECONDS"],
    )


def run_scheduler(burst: bool = False, watch=(), on_loss=None) -> None:
    """Poll until stopped. `watch`: periodic job ids whose disappearance means Redis lost its
    data; `on_loss` is then called to rebuild from the database."""
    make_scheduler(watch, on_loss).run(burst=burst)


# -- what Redis knows of the processes and queues (docs/REFERENCE.md, Operations) ---------------


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def _parse(value) -> datetime | None:
    text = _text(value)
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def processes() -> list[dict]:
    """Every worker on this app's queues (RQ's own worker registry: name, host, pid, state, last
    beat, birth) and every scheduler that has beaten in the last day, each with `last_beat` (a
    datetime, None when unknown). Three round trips plus one per worker."""
    conn = redis_conn()
    found: dict[str, dict] = {}
    for queue in (work_queue(), control_queue()):
        for worker in _WorkerRecord.all(queue=queue):
            found.setdefault(
                worker.name,
                {
                    "role": "worker",
                    "name": worker.name,
                    "host": worker.hostname,
                    "pid": worker.pid,
                    "runs": "RQ worker on " + ", ".join(worker.queue_names()),
                    "state": worker.get_state(),
                    "since": worker.birth_date and worker.birth_date.replace(tzinfo=timezone.utc),
                    "last_beat": worker.last_heartbeat and worker.last_heartbeat.replace(tzinfo=timezone.utc),
                    "jobs_done": worker.successful_job_count,
                    "jobs_failed": worker.failed_job_count,
                    "key": worker.key,
                },
            )
    workers = list(found.values())
    with conn.pipeline(transaction=False) as pipe:
        for w in workers:
            pipe.hmget(w.pop("key"), "shop_job", "shop_job_since", "shop_last_job", "shop_last_job_at")
        extras = pipe.execute()
    for w, (job, job_since, last_job, last_job_at) in zip(workers, extras):
        w.update(
            job=_text(job) or None,
            job_since=_parse(job_since),
            last_job=_text(last_job) or None,
            last_job_at=_parse(last_job_at),
        )

    index = _scheduler_beats_key()
    day_ago = time.time() - 86400
    with conn.pipeline(transaction=False) as pipe:
        pipe.zremrangebyscore(index, "-inf", day_ago)
        pipe.zrange(index, 0, -1, withscores=True)
        _, beats = pipe.execute()
    with conn.pipeline(transaction=False) as pipe:
        for name, _ in beats:
            pipe.hgetall(f"{index}:{_text(name)}")
        records = pipe.execute() if beats else []
    schedulers = []
    for (name, score), record in zip(beats, records):
        record = {_text(k): _text(v) for k, v in record.items()}
        schedulers.append(
            {
                "role": "scheduler",
                "name": _text(name),
                "host": record.get("host"),
                "pid": int(record["pid"]) if record.get("pid") else None,
                "runs": record.get("runs") or "rq-scheduler",
                "state": "polling" if record else "record expired",
                "since": _parse(record.get("since")),
                "last_beat": datetime.fromtimestamp(score, timezone.utc),
                "job": None,
                "job_since": None,
                "last_job": record.get("last_job") or None,
                "last_job_at": _parse(record.get("last_job_at")),
                "moved_jobs_at": _parse(record.get("last_lock_at")),
            }
        )
    return workers + schedulers


def queue_depths(now: datetime) -> list[dict]:
    """Each RQ queue's depth and the age of its oldest job, and rq-scheduler's schedule: how
    many jobs it holds, how many are due (should have been moved already) and the oldest due
    one's age. Two round trips."""
    queues = [control_queue(), work_queue()]
    conn = redis_conn()
    sched_key = Scheduler.scheduled_jobs_key
    with conn.pipeline(transaction=False) as pipe:
        for q in queues:
            pipe.llen(q.key)
            pipe.lindex(q.key, 0)
        pipe.zcard(sched_key)
        pipe.zcount(sched_key, "-inf", now.timestamp())
        pipe.zrange(sched_key, 0, 0, withscores=True)
        answers = pipe.execute()
    heads = [_text(answers[2 * i + 1]) for i in range(len(queues))]
    with conn.pipeline(transaction=False) as pipe:
        for head in heads:
            pipe.hget(Job.key_for(head), "enqueued_at") if head else pipe.echo("")
        enqueued = pipe.execute()
    result = []
    for i, q in enumerate(queues):
        at = _parse(enqueued[i])
        result.append(
            {
                "name": q.name,
                "kind": "rq queue",
                "depth": int(answers[2 * i]),
                "oldest_age_seconds": max(0.0, (now - at).total_seconds()) if at else None,
            }
        )
    scheduled, due, first = answers[-3], answers[-2], answers[-1]
    oldest_due = None
    if due and first:
        oldest_due = max(0.0, now.timestamp() - first[0][1])
    result.append(
        {
            "name": "rq-scheduler",
            "kind": "schedule",
            "depth": int(scheduled),
            "due": int(due),
            "oldest_age_seconds": oldest_due,
        }
    )
    return result


def next_run_at(job_id: str) -> datetime | None:
    """When rq-scheduler will next move a (periodic) job: the sweep's next cycle."""
    score = redis_conn().zscore(Scheduler.scheduled_jobs_key, job_id)
    return datetime.fromtimestamp(score, timezone.utc) if score is not None else None


def ping() -> bool:
    return bool(redis_conn().ping())
