"""Drain slots: deliveries are run by drain jobs, not one job each (RQ's own bookkeeping costs
tens of round trips a job). At most DRAIN_SLOTS drains wait in the queue at once: announcing
takes a free slot (a key, SET NX with a TTL so a lost drain cannot block the next for long) and
enqueues a drain only then. A drain frees its slot as its first action, so work committed while
it runs always finds a slot free and wakes another drain: no announcement is ever lost."""

from __future__ import annotations

import uuid

from flask import current_app
from rq import Queue

from ..extensions import per_app
from .connection import DRAIN_JOB, queue_names, redis_conn, work_queue

DRAIN_SLOTS = 2
DRAIN_SLOT_TTL_SECONDS = 30
_TAKE_SLOT = """
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, '1', 'NX', 'EX', tonumber(ARGV[1])) then return i end
end
return 0
"""


def _drain_key(slot: int) -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:drain-pending:{slot}"


def take_drain_slot() -> int | None:
    """One round trip: the first free slot, now taken, or None when every slot has a drain
    waiting (which will see the work that was just committed)."""
    script = per_app("take_drain_slot", lambda: redis_conn().register_script(_TAKE_SLOT))
    taken = script(keys=[_drain_key(i) for i in range(DRAIN_SLOTS)], args=[DRAIN_SLOT_TTL_SECONDS])
    return int(taken) - 1 if taken else None


def _drain_job_prefix() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}-drain-"


def drain_job(slot: int | None):
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
    slot = None if force else take_drain_slot()
    if slot is None and not force:
        return False
    work_queue().enqueue_many([drain_job(slot)])
    return True


def drain_started(slot: int | None) -> None:
    """A drain's first action: free its slot, so anything announced from now on wakes the next."""
    if slot is not None:
        redis_conn().delete(_drain_key(slot))


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
