"""Heartbeats, as the worker and the scheduler write them and the health readings read them:
how often, how a time and a job are written, and where the schedulers' beats are kept."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import current_app
from rq.job import Job


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
