"""What Redis knows of the processes and queues (docs/REFERENCE.md, Operations): the workers and
schedulers with their last beats, the queues' depths and ages, and whether Redis answers."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from rq.job import Job
from rq_scheduler import Scheduler

from ..node import node_of
from .beats import pulses_key, scheduler_beats_key
from .connection import control_queue, redis_conn, work_queue
from .worker import WorkerRecord


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
    """Every worker on this app's queues (RQ's own worker registry: name, node, host, pid, state,
    last beat, birth) and every scheduler that has beaten in the last day, each with `last_beat` (a
    datetime, None when unknown) and `node` (BACKSTOP_NODE_NAME of its process: RQ's `hostname`
    field for a worker). Three round trips plus one per worker."""
    conn = redis_conn()
    found: dict[str, dict] = {}
    for queue in (work_queue(), control_queue()):
        for worker in WorkerRecord.all(queue=queue):
            found.setdefault(
                worker.name,
                {
                    "role": "worker",
                    "name": worker.name,
                    "node": worker.hostname or "",
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
            pipe.hmget(w.pop("key"), "shop_job", "shop_job_since", "shop_last_job", "shop_last_job_at", "shop_host")
        extras = pipe.execute()
    for w, (job, job_since, last_job, last_job_at, host) in zip(workers, extras, strict=True):
        w.update(
            host=_text(host) or w["host"],
            job=_text(job) or None,
            job_since=_parse(job_since),
            last_job=_text(last_job) or None,
            last_job_at=_parse(last_job_at),
        )

    index = scheduler_beats_key()
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
    for (name, score), record in zip(beats, records, strict=True):
        record = {_text(k): _text(v) for k, v in record.items()}
        schedulers.append(
            {
                "role": "scheduler",
                "name": _text(name),
                # Its record outlives a stall by 3 x HEALTH_STALE_SECONDS; its name (node:scheduler-pid)
                # still says where it ran. Before node names, a scheduler's node was its host.
                "node": record.get("node")
                or (node_of(_text(name)) if ":" in _text(name) else record.get("host") or ""),
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


def pulses() -> dict[str, datetime]:
    """Each process's latest pulse (beats.Pulse), by name; entries older than a day are dropped."""
    with redis_conn().pipeline(transaction=False) as pipe:
        pipe.zremrangebyscore(pulses_key(), "-inf", time.time() - 86400)
        pipe.zrange(pulses_key(), 0, -1, withscores=True)
        _, found = pipe.execute()
    return {_text(name): datetime.fromtimestamp(score, timezone.utc) for name, score in found}


AGE_SAMPLE = 50  # jobs read at each end of a queue for its oldest one's age


def queue_depths(now: datetime) -> list[dict]:
    """Each RQ queue's depth and the age of its oldest job (among the AGE_SAMPLE at each end), and
    rq-scheduler's schedule: how
    many jobs it holds, how many are due (should have been moved already) and the oldest due
    one's age. Two round trips (the second reads up to 2 x AGE_SAMPLE job hashes per queue)."""
    queues = [control_queue(), work_queue()]
    conn = redis_conn()
    sched_key = Scheduler.scheduled_jobs_key
    with conn.pipeline(transaction=False) as pipe:
        for q in queues:
            pipe.llen(q.key)
            pipe.lrange(q.key, 0, AGE_SAMPLE - 1)
            pipe.lrange(q.key, -AGE_SAMPLE, -1)
        pipe.zcard(sched_key)
        pipe.zcount(sched_key, "-inf", now.timestamp())
        pipe.zrange(sched_key, 0, 0, withscores=True)
        answers = pipe.execute()
    # A job queued at the front (a takeover, a retry) sits before older ones: the oldest is
    # looked for among both ends, which is the whole queue up to 2 x AGE_SAMPLE jobs.
    sampled = [sorted({_text(j) for j in answers[3 * i + 1] + answers[3 * i + 2]}) for i in range(len(queues))]
    with conn.pipeline(transaction=False) as pipe:
        for job_id in (j for ids in sampled for j in ids):
            pipe.hget(Job.key_for(job_id), "enqueued_at")
        times = iter(pipe.execute())
    enqueued = [[_parse(next(times)) for _ in ids] for ids in sampled]
    result = []
    for i, q in enumerate(queues):
        at = min(filter(None, enqueued[i]), default=None)
        result.append(
            {
                "name": q.name,
                "kind": "rq queue",
                "depth": int(answers[3 * i]),
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


def ping() -> bool:
    return bool(redis_conn().ping())
