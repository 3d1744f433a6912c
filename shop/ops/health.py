"""Is every moving part alive? (docs/REFERENCE.md, Operations)

`judge` is the rule, a pure function of what was seen and `now`: a role (the workers, the
scheduler) is healthy when at least one of its processes beat within HEALTH_STALE_SECONDS; the
outbox is healthy while its oldest due item has waited less than OUTBOX_LAG_FACTOR times that.
`snapshot` gathers what it judges from Redis (RQ's worker registry, the scheduler's heartbeat)
and the database (due rows), for /healthz, the dashboard and /metrics alike.

A Redis that lost its data (a restart without persistence, a FLUSHALL) holds no heartbeat until
each process beats again, at most one heartbeat interval later (HEALTH_STALE_SECONDS / 4, 15 s
at most; each beat writes the whole record and registration again). In that gap each web process
goes by the beats it has itself seen: a process seen beating within HEALTH_STALE_SECONDS still
counts, which is what the rule says, and one that stops meanwhile is still named as stalled. A
web process that saw none (one started during the gap) answers "no worker seen" until the next
beat.
"""

from __future__ import annotations

import threading
from datetime import datetime

from flask import current_app
from sqlalchemy import func, select, text

from .. import clock, queue
from ..domain.deadlines import as_utc
from ..extensions import db
from ..models import OutboxDelivery, ScheduledCommand, WorkStatus
from ..queue.beats import STALL_AFTER_SECONDS

# A due delivery or command that has waited this many times HEALTH_STALE_SECONDS (5 min at the
# default) means work is not getting done although processes beat: a drain takes a due row
# within a second or two, and the relay re-announces what Redis lost every few seconds.
OUTBOX_LAG_FACTOR = 5
ROLES = (("worker", "no worker"), ("scheduler", "no scheduler"))


def _ago(seconds: float) -> str:
    return f"{int(seconds)} s ago"


def quiet_for(p: dict, now: datetime, stale: int, stall_after: float) -> tuple[float, bool]:
    """(seconds since the process was last heard from, stalled) for one process. A process that
    pulses (queue.beats.Pulse) is heard from every second: stalled once its pulse is older than
    `stall_after`. Without a pulse (or with a full beat already stale), its full beat counts,
    against `stale` (HEALTH_STALE_SECONDS)."""
    beat_age = (now - p["last_beat"]).total_seconds()
    pulse = p.get("pulse_at")
    if pulse is not None and beat_age <= stale:
        pulse_age = max(0.0, (now - pulse).total_seconds())
        return pulse_age, pulse_age > stall_after
    return beat_age, beat_age > stale


def judge_role(
    role: str, seen: list[dict], now: datetime, stale: int, stall_after: float = STALL_AFTER_SECONDS
) -> tuple[bool, str, list[str]]:
    """(healthy, words, stalled process names) for one role, from its processes' `last_beat`
    and `pulse_at` (quiet_for). A process with `in_redis` False is one this web process saw
    beating but Redis no longer lists (see the module's note on a Redis that lost its data)."""
    none_words = dict(ROLES)[role]
    judged = sorted(
        (*quiet_for(p, now, stale, stall_after), p["name"], p.get("in_redis", True), p.get("pulse_at") is not None)
        for p in seen
        if p.get("last_beat")
    )
    fresh = [(a, n, r) for a, bad, n, r, _ in judged if not bad]
    stalled = [n for _, bad, n, _, _ in judged if bad]
    stalled_words = (
        "; stalled: " + ", ".join(f"{n} (last beat {_ago(a)})" for a, bad, n, _, _ in judged if bad) if stalled else ""
    )
    if fresh and not any(r for _, _, r in fresh):
        age, name, _ = fresh[0]
        return (
            True,
            (
                f"ok: {name} beat {_ago(age)} (Redis holds no record of it now: it may have lost its "
                f"data; each process writes its record again at its next beat){stalled_words}"
            ),
            stalled,
        )
    if fresh:
        return True, f"ok: {len(fresh)} beating, last beat {_ago(fresh[0][0])}{stalled_words}", stalled
    if judged:
        limit = (
            f"{stall_after:g} s (its pulse)"
            if any(pulsing and a <= stale for a, _, _, _, pulsing in judged)
            else f"{stale} s (HEALTH_STALE_SECONDS)"
        )
        return (
            False,
            f"{none_words} has beaten for over {limit}: "
            + ", ".join(f"{n} stalled, last beat {_ago(a)}" for a, _, n, _, _ in judged),
            stalled,
        )
    return False, f"{none_words} seen: none has registered with Redis", stalled


def judge_outbox(oldest_due: dict[str, datetime | None], now: datetime, stale: int) -> tuple[bool, str]:
    limit = OUTBOX_LAG_FACTOR * stale
    lags = {kind: (now - as_utc(at)).total_seconds() for kind, at in oldest_due.items() if at is not None}
    late = {kind: lag for kind, lag in lags.items() if lag > limit}
    if late:
        return False, (
            "lagging: "
            + ", ".join(
                f"the oldest due {kind.replace('_', ' ')} has waited {int(lag)} s" for kind, lag in sorted(late.items())
            )
            + f" (limit {limit} s, {OUTBOX_LAG_FACTOR} x HEALTH_STALE_SECONDS)"
        )
    if lags:
        return True, f"ok: oldest due item waited {int(max(lags.values()))} s"
    return True, "ok: nothing due"


def oldest_due(now: datetime) -> dict[str, datetime | None]:
    """The oldest pending delivery and command that are due: two index-only MINs over
    (status, next_attempt_at)."""
    result = {}
    for kind, model in (("delivery", OutboxDelivery), ("command", ScheduledCommand)):
        result[kind] = db.session.execute(
            select(func.min(model.next_attempt_at)).where(
                model.status == WorkStatus.PENDING, model.next_attempt_at <= now
            )
        ).scalar()
    return result


_memory_lock = threading.Lock()
# How long a process Redis no longer lists stays in a web process's memory after its last beat:
# as long as the scheduler's own record outlives a stall (queue.make_scheduler).
FORGET_AFTER_STALE_LIMITS = 3


def _with_remembered(seen: list[dict], now: datetime, stale: int) -> list[dict]:
    """The processes Redis lists, plus those this web process saw beating before that Redis no
    longer lists (`in_redis` False), each kept per app until FORGET_AFTER_STALE_LIMITS x stale
    after its last beat."""
    memory = current_app.extensions.setdefault("backstop", {}).setdefault("seen_processes", {})
    listed = {p["name"] for p in seen}
    with _memory_lock:
        for p in seen:
            if p.get("last_beat") is not None:
                memory[p["name"]] = dict(p)
        for name in [
            n for n, p in memory.items() if (now - p["last_beat"]).total_seconds() > FORGET_AFTER_STALE_LIMITS * stale
        ]:
            del memory[name]
        gone = [{**p, "in_redis": False} for name, p in memory.items() if name not in listed]
    return [{**p, "in_redis": True} for p in seen] + gone


def snapshot(now: datetime | None = None, *, with_queues: bool = False) -> dict:
    """Everything /healthz, the dashboard and /metrics show about liveness, judged. Redis or the
    database being down is a finding, not an exception."""
    now = now or clock.current().now()  # the process's clock: a test moves it instead of waiting
    stale = current_app.config["HEALTH_STALE_SECONDS"]
    checks: dict[str, str] = {}
    problems: list[str] = []
    due = _ask_database(now, checks, problems)
    procs, queues, next_sweep, pulses = _ask_redis(now, with_queues, checks, problems)
    stall_after = min(STALL_AFTER_SECONDS, stale)
    stalled: set[str] = set()
    if procs is not None:
        procs = [{**p, "pulse_at": pulses.get(p["name"])} for p in _with_remembered(procs, now, stale)]
        stalled = _judge_processes(procs, now, stale, checks, problems)
    else:
        checks["workers"] = checks["scheduler"] = "unknown: Redis does not answer"
    if due is not None:
        ok, words = judge_outbox(due, now, stale)
        checks["outbox"] = words
        if not ok:
            problems.append("outbox " + words)
    else:
        checks["outbox"] = "unknown: the database does not answer"

    for p in procs or ():
        age = quiet_for(p, now, stale, stall_after)[0] if p.get("last_beat") else None
        p["beat_age_seconds"] = round(age, 1) if age is not None else None
        p["stalled"] = p["name"] in stalled or age is None
    return {
        "healthy": not problems,
        "checks": checks,
        "problems": problems,
        "processes": procs or [],
        "queues": queues,
        "next_sweep_at": next_sweep,
        "oldest_due": due,
        "stale_seconds": stale,
        "stall_after_seconds": stall_after,
        "outbox_lag_limit_seconds": OUTBOX_LAG_FACTOR * stale,
    }


def _ask_database(now: datetime, checks: dict, problems: list) -> dict | None:
    """The oldest due rows, or None (with the finding) when the database does not answer."""
    try:
        db.session.execute(text("SELECT 1"))
        due = oldest_due(now)
        db.session.rollback()
        checks["database"] = "ok"
        return due
    except Exception as exc:
        db.session.rollback()
        checks["database"] = f"down: {type(exc).__name__}"
        problems.append(f"the database does not answer ({type(exc).__name__})")
        return None


def _ask_redis(now: datetime, with_queues: bool, checks: dict, problems: list) -> tuple:
    """(processes, queues, next sweep, pulses) as Redis lists them; processes None when it does
    not answer."""
    procs = queues = next_sweep = None
    pulses = {}
    try:
        queue.ping()
        procs = queue.processes()
        pulses = queue.pulses()
        if with_queues:
            queues = queue.queue_depths(now)
            ids = queue.periodic_job_ids(True)
            next_sweep = queue.next_run_at(ids[1])
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"down: {type(exc).__name__}"
        problems.append(f"Redis does not answer ({type(exc).__name__}): no job runs and no heartbeat can be read")
    return procs, queues, next_sweep, pulses


def _judge_processes(procs: list[dict], now: datetime, stale: int, checks: dict, problems: list) -> set[str]:
    """Each role judged from its processes' beats; returns the names of the stalled ones."""
    stalled: set[str] = set()
    for role, _ in ROLES:
        ok, words, role_stalled = judge_role(
            role, [p for p in procs if p["role"] == role], now, stale, min(STALL_AFTER_SECONDS, stale)
        )
        checks["workers" if role == "worker" else "scheduler"] = words
        stalled.update(role_stalled)
        if not ok:
            problems.append(words)
    return stalled
