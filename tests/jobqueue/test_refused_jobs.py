"""Whoever can write to Redis must not run code in the worker or the scheduler (docs/REFERENCE.md,
`flask shop worker`). These tests put jobs into the shop's queues as an attacker would (pickled
data, by hand and through RQ's own pickling Queue; JSON naming a function outside shop.jobs; a
job RQ cannot even read), run the real worker, and check that nothing of theirs ran, that each
refusal is logged, and that the worker still runs the shop's own job queued after them."""

from __future__ import annotations

import json
import logging
import os
import pickle
import uuid
import zlib
from datetime import datetime, timedelta, timezone

import pytest
from rq import Callback, Queue
from rq.job import Job
from rq.serializers import JSONSerializer, PickleSerializer

from shop import queue
from shop.queue.connection import ShopJob


class _RunsOnUnpickling:
    """What a forged pickle does: its loading alone runs a command."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.fixture
def pwned(tmp_path):
    """Paths an attacker's job would create; none may exist after the test."""
    paths = [str(tmp_path / f"pwned-{uuid.uuid4().hex}") for _ in range(4)]
    yield paths
    for path in paths:
        assert not os.path.exists(path), f"an attacker's job ran: {path} exists"


def _raw_job(conn, queue_name: str, fields: dict) -> str:
    """A job hash written field by field, and its id pushed onto the queue, as RQ's enqueue would."""
    job_id = f"forged-{uuid.uuid4().hex}"
    conn.hset(Job.key_for(job_id), mapping={"status": "queued", "origin": queue_name, **fields})
    conn.rpush(f"{Queue.redis_queue_namespace_prefix}{queue_name}", job_id)
    return job_id


def test_the_worker_refuses_jobs_outside_shop_jobs_and_pickled_jobs_and_goes_on(
    fresh_ctx, redis_conn, pwned, caplog, capfd
):
    control, work = queue.queue_names()
    marker = f"PRINTED-{uuid.uuid4().hex}"
    forged = {
        # RQ's own job, pickled, naming builtins.print (as any RQ client with the default serializer)
        "print": Job.create(
            "builtins.print", args=(marker,), connection=redis_conn, serializer=PickleSerializer, origin=work
        ),
        # pickled data whose unpickling alone would run a command
        "pickle-bomb": _raw_job(
            redis_conn,
            work,
            {"data": pickle.dumps(_RunsOnUnpickling(f"touch {pwned[0]}")), "description": "a forged pickle"},
        ),
        # RQ's own Queue.enqueue (pickle by default) onto the shop's control queue
        "os.system-pickled": Queue(control, connection=redis_conn).enqueue("os.system", f"touch {pwned[1]}").id,
        # readable JSON, but a function outside shop.jobs: only the allow-list stops this one
        "os.system-json": Queue(work, connection=redis_conn, serializer=JSONSerializer)
        .enqueue("os.system", f"touch {pwned[2]}")
        .id,
        # an allowed name, with a callback RQ would import and call
        "callback": Queue(work, connection=redis_conn, serializer=JSONSerializer)
        .enqueue(queue.RELAY_JOB, on_failure=Callback("os.system"))
        .id,
        # a hash RQ cannot read at all
        "garbage": _raw_job(redis_conn, work, {"data": b"\x80\x04garbage", "created_at": "not a time"}),
    }
    printed = forged.pop("print")
    printed.save()
    redis_conn.rpush(f"{Queue.redis_queue_namespace_prefix}{work}", printed.id)
    forged["print"] = printed.id
    legit = queue.work_queue().enqueue(queue.RELAY_JOB)  # the shop's own job, queued after them

    with caplog.at_level(logging.ERROR, logger="shop.queue"):
        queue.run_worker(burst=True)

    out, err = capfd.readouterr()
    assert not [path for path in pwned if os.path.exists(path)], "an attacker's job ran"
    assert marker not in [line.strip() for line in (out + err).splitlines()]  # quoted in a refusal, never printed
    assert ShopJob.fetch(legit.id, connection=redis_conn).get_status() == "finished", caplog.text
    refusals = [r.getMessage() for r in caplog.records if "refused job" in r.getMessage()]
    for name, job_id in forged.items():
        [line] = [m for m in refusals if job_id in m]
        assert redis_conn.exists(Job.key_for(job_id)) == 0, f"{name} was kept"
        if name == "os.system-json":
            assert "'os.system'" in line and "not one of shop.jobs' entry points" in line
        elif name == "print":
            assert "not JSON" in line and "builtins.print" in line  # named by its description
        elif name == "os.system-pickled":
            assert "not JSON" in line and "os.system" in line
        elif name == "callback":
            assert "callbacks" in line
    assert all(r.levelno == logging.ERROR for r in caplog.records if "refused job" in r.getMessage())


def test_the_scheduler_deletes_a_pickled_or_unreadable_scheduled_job_instead_of_queueing_it(
    fresh_ctx, redis_conn, pwned, caplog
):
    from rq_scheduler import Scheduler

    _, work = queue.queue_names()
    old = Scheduler(queue_name=work, connection=redis_conn)  # rq-scheduler's default: pickle
    job = old.enqueue_in(timedelta(seconds=-1), "os.system", f"touch {pwned[3]}")
    garbage = f"forged-{uuid.uuid4().hex}"  # a hash RQ cannot read: rq-scheduler alone would raise
    redis_conn.hset(Job.key_for(garbage), mapping={"data": b"x", "created_at": "not a time", "origin": work})
    redis_conn.zadd(Scheduler.scheduled_jobs_key, {garbage: 0})
    with caplog.at_level(logging.ERROR, logger="shop.queue"):
        queue.make_scheduler().enqueue_jobs()
    assert redis_conn.exists(Job.key_for(garbage)) == 0
    assert redis_conn.zscore(Scheduler.scheduled_jobs_key, garbage) is None
    assert any(garbage in r.getMessage() and "cannot read" in r.getMessage() for r in caplog.records)
    assert job.id not in [j.decode() for j in redis_conn.lrange(f"rq:queue:{work}", 0, -1)]
    assert redis_conn.exists(Job.key_for(job.id)) == 0
    assert redis_conn.zscore(Scheduler.scheduled_jobs_key, job.id) is None
    assert any(job.id in r.getMessage() and "not JSON" in r.getMessage() for r in caplog.records)


def test_an_older_releases_pickled_periodic_job_is_replaced_by_a_json_one(fresh_ctx, redis_conn, caplog):
    from rq_scheduler import Scheduler

    relay_id = queue.periodic_job_ids(False)[0]
    control, _ = queue.queue_names()
    Scheduler(queue_name=control, connection=redis_conn).schedule(  # as the older release registered it
        datetime.now(timezone.utc),
        queue.RELAY_JOB,
        interval=10,
        repeat=None,
        id=relay_id,
        queue_name=control,
        result_ttl=-1,
    )
    with pytest.raises(ValueError):
        json.loads(zlib.decompress(redis_conn.hget(Job.key_for(relay_id), "data")))  # pickled
    with caplog.at_level(logging.WARNING, logger="shop.queue"):
        done = queue.register_periodic_jobs(10, None)
    assert done == [f"{relay_id} (registered, every 10s)"]
    assert json.loads(zlib.decompress(redis_conn.hget(Job.key_for(relay_id), "data")))[0] == queue.RELAY_JOB
    assert any(relay_id in r.getMessage() and "registering it again" in r.getMessage() for r in caplog.records)
    assert queue.register_periodic_jobs(10, None) == [f"{relay_id} (kept, every 10s)"]


@pytest.mark.slow
def test_a_real_worker_process_refuses_forged_jobs_and_runs_the_shops_own(fresh_ctx, redis_conn, pwned):
    """`flask shop worker --burst`, as the Procfile runs it: the attacker's jobs first, then the shop's."""
    from process_support import Processes, process_env

    control, work = queue.queue_names()
    marker = f"PRINTED-{uuid.uuid4().hex}"
    printed = Queue(work, connection=redis_conn).enqueue("builtins.print", marker)
    bomb = _raw_job(redis_conn, control, {"data": pickle.dumps(_RunsOnUnpickling(f"touch {pwned[0]}"))})
    system = Queue(work, connection=redis_conn, serializer=JSONSerializer).enqueue("os.system", f"touch {pwned[1]}")
    printed_json = Queue(work, connection=redis_conn, serializer=JSONSerializer).enqueue("builtins.print", marker)
    legit = queue.work_queue().enqueue(queue.RELAY_JOB)
    procs = Processes()
    try:
        worker = procs.start("worker", ["shop", "worker", "--burst"], process_env(fresh_ctx))
        assert worker.wait(timeout=60) == 0, procs.logs()
        logs = procs.logs()
    finally:
        procs.stop()
    assert marker not in [line.strip() for line in logs.splitlines()]  # quoted in the refusal, never printed
    assert f"refused job {printed.id}: its data is not JSON" in logs and "builtins.print" in logs, logs
    assert f"refused job {bomb}: its data is not JSON" in logs, logs
    assert f"refused job {system.id}: it names 'os.system'" in logs, logs
    assert f"refused job {printed_json.id}: it names 'builtins.print'" in logs, logs
    assert ShopJob.fetch(legit.id, connection=redis_conn).get_status() == "finished", logs
