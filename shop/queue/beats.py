"""Heartbeats, as the worker and the scheduler write them and the health readings read them:
how often, how a time and a job are written, and where the schedulers' beats are kept."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

from flask import current_app
from rq.job import Job

log = logging.getLogger("shop.queue")


def heartbeat_seconds() -> int:
    """How often a worker or the scheduler leaves a heartbeat: four beats per HEALTH_STALE_SECONDS
    (every 15 s at the default of 60, every second at the smallest), so one late beat never
    makes a healthy process look stalled."""
    return max(1, min(15, current_app.config["HEALTH_STALE_SECONDS"] // 4))


def iso(ts: datetime | None) -> str:
    return ts.astimezone(timezone.utc).isoformat() if ts is not None else ""


def describe_job(job: Job) -> str:
    assert job.func_name is not None  # the shop's jobs all name one of its functions
    return f"{job.func_name.rsplit('.', 1)[-1]}({', '.join(map(str, job.args or ()))})"


def scheduler_beats_key() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:heartbeats:scheduler"


# A pulse: a second, lighter heartbeat (one ZADD) a thread of each worker and scheduler writes
# every PULSE_SECONDS, whatever its main loop is doing. A process whose pulse is older than
# STALL_AFTER_SECONDS is stalled (shop.ops.health): SIGSTOP, a paused VM or a swapped-out process
# stop the thread with the rest, and the full beat above comes only every heartbeat_seconds().
# Ten pulses missed, not five: a busy machine can leave a live thread unscheduled for seconds
# (seen on 2 loaded cores), and a healthy process must not be reported stalled for that.
PULSE_SECONDS = 1.0
STALL_AFTER_SECONDS = 10


def pulses_key() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:pulses"


class Pulse:
    """The pulse thread of one process: ZADD `key` {name: now} every PULSE_SECONDS while
    `vouch()` says the process is doing what it should (a worker: not past its job's timeout),
    until `stop()`, which also removes the entry (a clean stop is not a stall)."""

    def __init__(self, conn, key: str, name: str, vouch=lambda: True):
        self.conn, self.key, self.name, self.vouch = conn, key, name, vouch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pulse", daemon=True)
            self._thread.start()

    def beat(self) -> None:
        self.conn.zadd(self.key, {self.name: time.time()})

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.vouch():
                try:
                    self.beat()
                except Exception as exc:  # noqa: BLE001 - Redis away: the main loop reports it
                    log.debug("pulse of %s failed: %s", self.name, exc)
            self._stop.wait(PULSE_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        try:
            self.conn.zrem(self.key, self.name)
        except Exception as exc:  # noqa: BLE001 - Redis away: the entry simply goes stale
            log.debug("could not remove the pulse of %s: %s", self.name, exc)
