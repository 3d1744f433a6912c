"""The scheduler: rq-scheduler, asking the database each poll for due work, watching for Redis
losing its data, beating where the health readings look, and kept alive through a Redis outage."""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import datetime, timezone

from flask import current_app
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..node import node_name
from .beats import Pulse, describe_job, iso, pulses_key, scheduler_beats_key
from .connection import ShopScheduler, redis_conn, refusal, work_queue

log = logging.getLogger("shop.queue")


class _WatchfulScheduler(ShopScheduler):
    """rq-scheduler that notices Redis losing its data while it runs (a restart without
    persistence, a FLUSHDB, an eviction). The periodic jobs live in Redis and are what would
    otherwise notice, so their absence is the sign: on a poll where one is missing, `on_loss`
    rebuilds Redis's part from the database before due jobs are moved. One ZSCORE per periodic
    job per poll; only the scheduler holding rq-scheduler's lock does it."""

    def __init__(
        self,
        *args,
        watch=(),
        on_loss=None,
        on_poll=None,
        beat_key: str = "",
        beat_index: str = "",
        beat_ttl: int = 180,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self._watch = tuple(watch)
        self._on_loss = on_loss
        self._on_poll = on_poll
        self.beat_name = self.name_here()
        self._beat_key, self._beat_index, self._beat_ttl = beat_key, beat_index, beat_ttl
        self._born = datetime.now(timezone.utc)
        self._last_moved: tuple[str, datetime] | None = None
        self._last_lock_at: datetime | None = None
        self.pulse = Pulse(self.connection, pulses_key(), self.beat_name)

    @staticmethod
    def name_here() -> str:
        """This process's scheduler, as its heartbeat names it: `node:scheduler-pid`."""
        return f"{node_name()}:scheduler-{os.getpid()}"

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
                        "node": node_name(),
                        "host": socket.gethostname(),
                        "pid": os.getpid(),
                        "runs": f"rq-scheduler for {self.queue_name}, polling every {self._interval} s",
                        "since": iso(self._born),
                        "last_beat": iso(now),
                        "last_job": self._last_moved[0] if self._last_moved else "",
                        "last_job_at": iso(self._last_moved[1]) if self._last_moved else "",
                        "last_lock_at": iso(self._last_lock_at),
                    },
                )
                pipe.expire(self._beat_key, self._beat_ttl)
                pipe.zadd(self._beat_index, {self.beat_name: now.timestamp()})
            pipe.execute()

    def enqueue_job(self, job):
        """Move a due job to its queue, unless it may not run (connection.refusal: a pickled job
        of an older release, or one naming a function that is not shop.jobs'): that one is
        logged and deleted here, instead of being handed to a worker that would refuse it."""
        why = refusal(job)
        if why is not None:
            log.error("scheduler: refused scheduled job %s: %s; deleted, not queued", job.id, why)
            self.cancel(job.id)
            self.connection.delete(job.key)
            return None
        self._last_moved = (describe_job(job), datetime.now(timezone.utc))
        return super().enqueue_job(job)

    def register_death(self):
        """A clean stop is not a stall: the heartbeat goes with the process."""
        self.pulse.stop()
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
        if not burst:
            self.pulse.start()
        resuming = False
        while True:
            try:
                if resuming:
                    # Our birth record may have outlived a blip (Redis kept its data): it is ours,
                    # and run() refuses to start while a live-looking scheduler of our name exists.
                    # Inside the try: Redis can go away again right after it answered.
                    self.connection.delete(self.key)
                    log.warning("scheduler: Redis answers again; resuming")
                return super().run(burst=burst)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if burst:
                    raise
                log.warning("scheduler: Redis unreachable (%s); waiting for it", exc)
                self._wait_for_redis()
                resuming = True

    def _wait_for_redis(self, pause: float = 1.0) -> None:
        while True:
            try:
                self.connection.ping()
                return
            except (RedisConnectionError, RedisTimeoutError):
                time.sleep(pause)

    def acquire_lock(self):
        """rq-scheduler's loop calls this once a poll, before it moves due jobs. Every scheduler
        first runs `on_poll` (the database asked for due deadlines, commands and deliveries, and a
        drain woken for them), lock or no lock: due work never waits for rq-scheduler's lock,
        which a scheduler killed mid-poll holds for up to its TTL. A failing poll is logged and
        the loop goes on; the next poll asks again."""
        if self._on_poll is not None:
            try:
                self._on_poll()
            except Exception as exc:  # noqa: BLE001 - a database or Redis blip must not stop the scheduler
                log.warning("scheduler: could not look for due work this poll: %s", exc)
        return super().acquire_lock()

    def enqueue_jobs(self):
        if self._on_loss is not None and self._watch:
            pipe = self.connection.pipeline(transaction=False)
            for job_id in self._watch:
                pipe.zscore(self.scheduled_jobs_key, job_id)
            if any(score is None for score in pipe.execute()):
                self._on_loss()
        return super().enqueue_jobs()


def make_scheduler(watch=(), on_loss=None, on_poll=None) -> _WatchfulScheduler:
    # The record outlives a stall for a while (so the console can name the stalled scheduler);
    # the index keeps its last beat time for a day after that.
    return _WatchfulScheduler(
        queue=work_queue(),
        connection=redis_conn(),
        interval=current_app.config["SCHEDULER_POLL_SECONDS"],
        watch=watch,
        on_loss=on_loss,
        on_poll=on_poll,
        beat_key=f"{scheduler_beats_key()}:{_WatchfulScheduler.name_here()}",
        beat_index=scheduler_beats_key(),
        beat_ttl=3 * current_app.config["HEALTH_STALE_SECONDS"],
    )


def run_scheduler(burst: bool = False, watch=(), on_loss=None, on_poll=None) -> None:
    """Poll until stopped. `watch`: periodic job ids whose disappearance means Redis lost its
    data; `on_loss` is then called to rebuild from the database. `on_poll`: called every poll."""
    make_scheduler(watch, on_loss, on_poll).run(burst=burst)
