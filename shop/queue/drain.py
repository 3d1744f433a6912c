"""Drain slots: due rows are run by drain jobs that claim them from the database in batches, not
one RQ job each (RQ's own bookkeeping costs tens of round trips a job). There are two kinds of
drain: deliveries (the outbox's handlers) and commands (deadlines, emails, refunds), each with its
own slots. At most DRAIN_SLOTS drains of a kind wait in the queue at once: waking one takes a free
slot (a key, SET NX with a TTL so a drain Redis lost cannot block the next for long) and enqueues
a drain only then. A drain frees its slot as its first action, so work committed while it runs
always finds a slot free and wakes another drain: no wake-up is ever lost. And none has to be
kept: every scheduler asks the database each poll whether due rows wait, and wakes a drain."""

from __future__ import annotations

import uuid
from enum import StrEnum

from flask import current_app
from redis.exceptions import RedisError
from rq import Queue, Worker, get_current_job

from .. import traces
from ..extensions import per_app
from .connection import COMMAND_DRAIN_JOB, DRAIN_JOB, queue_names, redis_conn, work_queue


class Drain(StrEnum):
    DELIVERIES = "deliveries"
    COMMANDS = "commands"


DRAIN_SLOTS = 2
# A slot outlives its drain only when Redis lost the drain's job (a failover's lost writes) or
# the job waits behind a long queue; either way the next wake-up after this long enqueues another.
DRAIN_SLOT_TTL_SECONDS = 10
_JOB = {Drain.DELIVERIES: DRAIN_JOB, Drain.COMMANDS: COMMAND_DRAIN_JOB}

# KEYS: the slots of each kind wanted, in order; ARGV: the TTL, then how many of KEYS belong to
# each kind. Returns, per kind, the 1-based slot taken (0 when all were busy). One round trip.
_TAKE_SLOTS = """
local taken, first = {}, 1
for k = 2, #ARGV do
  local n, got = tonumber(ARGV[k]), 0
  for i = first, first + n - 1 do
    if got == 0 and redis.call('SET', KEYS[i], '1', 'NX', 'EX', tonumber(ARGV[1])) then got = i - first + 1 end
  end
  taken[#taken + 1] = got
  first = first + n
end
return taken
"""


def _drain_key(slot: int, kind: Drain = Drain.DELIVERIES) -> str:
    prefix = current_app.config["QUEUE_PREFIX"]
    if kind is Drain.DELIVERIES:
        return f"{prefix}:drain-pending:{slot}"
    return f"{prefix}:drain-pending:{kind}:{slot}"


def take_drain_slots(*kinds: Drain) -> dict[Drain, int | None]:
    """One round trip: for each kind, the first free slot, now taken, or None when every slot
    of that kind has a drain waiting (which will see the work that was just committed)."""
    if not kinds:
        return {}
    script = per_app("take_drain_slots", lambda: redis_conn().register_script(_TAKE_SLOTS))
    keys = [_drain_key(i, kind) for kind in kinds for i in range(DRAIN_SLOTS)]
    taken = script(keys=keys, args=[DRAIN_SLOT_TTL_SECONDS, *(DRAIN_SLOTS for _ in kinds)])
    return {kind: (int(t) - 1 if t else None) for kind, t in zip(kinds, taken, strict=True)}


def take_drain_slot(kind: Drain = Drain.DELIVERIES) -> int | None:
    return take_drain_slots(kind)[kind]


def _drain_job_prefix() -> str:
    return f"{current_app.config['QUEUE_PREFIX']}-drain-"


# The drain job's meta key for the traceparent of the span that woke it (with tracing on).
WAKER = "traceparent"


def drain_job(slot: int | None, kind: Drain = Drain.DELIVERIES, at_front: bool = False):
    woken_by = traces.traceparent()
    return Queue.prepare_data(
        _JOB[kind],
        args=(slot,),
        result_ttl=0,
        failure_ttl=3600,
        timeout=300,
        job_id=f"{_drain_job_prefix()}{uuid.uuid4().hex}",
        at_front=at_front,
        meta={WAKER: woken_by} if woken_by else None,
    )


def waker() -> str | None:
    """The traceparent of the span that woke the running drain job (a commit's request, a
    scheduler's poll), kept in the job's meta; None outside a job or without one."""
    job = get_current_job()
    meta = job.meta if job is not None else None
    found = meta.get(WAKER) if isinstance(meta, dict) else None
    return found if isinstance(found, str) else None


def drain_jobs(*kinds: Drain) -> list:
    """The drain jobs to enqueue for `kinds`: one for each kind that had a free slot."""
    return [drain_job(slot, kind) for kind, slot in take_drain_slots(*kinds).items() if slot is not None]


def request_drain(force: bool = False, kind: Drain = Drain.DELIVERIES, continuing: bool = False) -> bool:
    """Ask for a drain of due rows of `kind`: when a slot is free, or always with `force` (the
    relay, which must not trust a slot whose drain Redis may have lost). Returns whether one was
    enqueued.

    `continuing`: a command drain that ran out of its budget with deadlines still due asks for
    its successor at the FRONT of the queue when another worker listens, whether or not a slot
    is free (the drains already waiting were woken by the poll, behind the delivery drains):
    behind those it would wait out one of their budgets (a second or two of lateness for every
    deadline of a flash sale). A lone worker takes turns; and the caller asks at the front only
    while no delivery has waited long (jobs.drain_commands), so the restores are never starved."""
    front = continuing and kind is Drain.COMMANDS and _workers_listening() > 1
    slot = None if force or front else take_drain_slot(kind)
    if slot is None and not (force or front):
        return False
    work_queue().enqueue_many([drain_job(slot, kind, at_front=front)])
    return True


def _workers_listening() -> int:
    return Worker.count(queue=work_queue())


def drain_started(slot: int | None, kind: Drain = Drain.DELIVERIES) -> None:
    """A drain's first action: free its slot, so anything announced from now on wakes the next."""
    if slot is not None:
        redis_conn().delete(_drain_key(slot, kind))


def other_jobs_waiting() -> bool:
    """Is anything but another drain queued for this worker (an operator's retry, a relay, a
    sweep)? A drain then hands the worker back between batches. (Yielding to a waiting drain,
    of either kind, would only pass the same work around: each has its budget.) One round trip."""
    control, work = queue_names()
    try:
        with redis_conn().pipeline(transaction=False) as pipe:
            pipe.llen(f"{Queue.redis_queue_namespace_prefix}{control}")
            pipe.lrange(f"{Queue.redis_queue_namespace_prefix}{work}", 0, 2 * DRAIN_SLOTS)
            control_waiting, head = pipe.execute()
    except RedisError:
        # Redis away (a failover, a restart): nothing can be known to wait, and the drain's own
        # work is in the database; it goes on rather than failing its job over a wake-up's question.
        return False
    drain = _drain_job_prefix().encode()
    return bool(control_waiting) or any(not job_id.startswith(drain) for job_id in head)
