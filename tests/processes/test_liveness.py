"""Liveness (docs/REFERENCE.md, Operations): workers and the scheduler leave heartbeats; /healthz
answers 503 naming what has not beaten for HEALTH_STALE_SECONDS, or an outbox item due for too
long; the dashboard lists each process with its age and each queue with its depth; /metrics
carries heartbeat ages, queue depth and lag. The rule is tested pure, in-process against real
Redis, and with real `flask shop worker` / `flask shop scheduler` processes stopped by SIGSTOP."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from compensation_support import cancel, order
from factories import place_order_for, seed_catalog_rows
from process_support import Processes, process_env
from shop import queue
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import ScheduledCommand
from shop.ops.health import judge_outbox, judge_role
from support import leave_heartbeats, log_in, poll_until, registered_worker, wait_until

JSON = {"Accept": "application/json"}
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def _beat(name: str, seconds_ago: float, role: str = "worker") -> dict:
    return {"role": role, "name": name, "last_beat": NOW - timedelta(seconds=seconds_ago)}


# -- the rule, pure ---------------------------------------------------------------------------


def test_a_role_is_healthy_while_one_of_its_processes_beat_within_the_stale_limit():
    ok, words, stalled = judge_role("worker", [_beat("w1", 2), _beat("w2", 90)], NOW, 60)
    assert ok and words.startswith("ok: 1 beating") and stalled == ["w2"] and "w2 (last beat 90 s ago)" in words


def test_a_role_whose_every_process_is_stale_is_unhealthy_and_names_them():
    ok, words, stalled = judge_role("worker", [_beat("w1", 61)], NOW, 60)
    assert not ok and stalled == ["w1"]
    assert words == "no worker has beaten for over 60 s (HEALTH_STALE_SECONDS): w1 stalled, last beat 61 s ago"


def test_nothing_ever_seen_says_so():
    ok, words, _ = judge_role("scheduler", [], NOW, 60)
    assert not ok and words == "no scheduler seen: none has registered with Redis"


def test_after_redis_lost_its_data_a_beat_this_process_saw_still_counts_until_it_is_stale():
    """A wipe empties Redis's records until each process's next beat; meanwhile a worker seen
    10 s ago was seen 10 s ago, and one seen 70 s ago is stale."""
    ok, words, _ = judge_role("worker", [{**_beat("w1", 10), "in_redis": False}], NOW, 60)
    assert ok and "w1 beat 10 s ago" in words and "lost its data" in words
    ok, words, stalled = judge_role("worker", [{**_beat("w1", 70), "in_redis": False}], NOW, 60)
    assert not ok and stalled == ["w1"] and "w1 stalled, last beat 70 s ago" in words


def test_the_outbox_is_unhealthy_when_its_oldest_due_item_waited_over_five_stale_limits():
    assert judge_outbox({"delivery": None, "command": None}, NOW, 60) == (True, "ok: nothing due")
    assert judge_outbox({"delivery": NOW - timedelta(seconds=299), "command": None}, NOW, 60)[0]
    ok, words = judge_outbox({"delivery": None, "command": NOW - timedelta(seconds=301)}, NOW, 60)
    assert not ok and "the oldest due command has waited 301 s" in words and "limit 300 s" in words


# -- in-process, real Redis ----------------------------------------------------------------------


def test_healthz_is_503_naming_the_worker_and_the_scheduler_when_none_has_beaten(fresh_app):
    r = fresh_app.test_client().get("/healthz")
    body = r.get_json()
    assert r.status_code == 503 and (body["database"], body["redis"]) == ("ok", "ok")
    assert body["workers"] == "no worker seen: none has registered with Redis"
    assert body["scheduler"] == "no scheduler seen: none has registered with Redis"
    assert body["problems"] == [body["workers"], body["scheduler"]]


def test_a_worker_writes_its_record_again_at_its_next_beat_after_redis_lost_its_data(fresh_app, redis_conn):
    """RQ registers a worker only at birth: without the re-registration on every beat, a worker
    would keep working after a FLUSHALL but never be seen again, and /healthz would say 503."""
    with fresh_app.app_context():
        worker = registered_worker("wiped-worker")
        scheduler = queue.make_scheduler()
        scheduler.heartbeat()
        assert {p["name"] for p in queue.processes()} == {"wiped-worker", scheduler.beat_name}
        redis_conn.flushdb()
        assert queue.processes() == []
        worker.heartbeat()  # what its idle loop does every heartbeat interval
        scheduler.heartbeat()  # what it does every poll
        again = {p["name"]: p for p in queue.processes()}
        assert set(again) == {"wiped-worker", scheduler.beat_name}
        assert again["wiped-worker"]["host"] and again["wiped-worker"]["runs"].startswith("RQ worker on ")
        assert (utcnow() - again["wiped-worker"]["last_beat"]).total_seconds() < 5


def test_a_web_process_that_saw_beats_stays_healthy_across_a_wipe_and_a_fresh_one_does_not(make_fresh_app, redis_conn):
    seen = make_fresh_app()
    leave_heartbeats(seen)
    assert seen.test_client().get("/healthz").status_code == 200
    redis_conn.flushdb()
    # Within HEALTH_STALE_SECONDS of the beats it saw: the rule still holds, whatever Redis forgot.
    after = seen.test_client().get("/healthz")
    assert after.status_code == 200 and "lost its data" in after.get_json()["workers"]
    fresh = make_fresh_app().test_client().get("/healthz")  # a web process started after the wipe
    assert fresh.status_code == 503 and fresh.get_json()["workers"].startswith("no worker seen")


def test_a_due_command_waiting_too_long_turns_healthz_503(make_fresh_app):
    app = make_fresh_app(HEALTH_STALE_SECONDS=10)
    leave_heartbeats(app)
    with app.app_context():
        db.session.add(
            ScheduledCommand(
                kind="send_email",
                payload={},
                status="pending",
                attempts=0,
                max_attempts=5,
                next_attempt_at=utcnow() - timedelta(seconds=51),
            )
        )
        db.session.commit()
    r = app.test_client().get("/healthz")
    assert r.status_code == 503 and r.get_json()["outbox"].startswith("lagging: the oldest due command has waited")
    with app.app_context():
        db.session.execute(update(ScheduledCommand).values(next_attempt_at=utcnow() - timedelta(seconds=5)))
        db.session.commit()
    assert app.test_client().get("/healthz").status_code == 200


def test_dashboard_and_metrics_show_processes_queues_and_lag(fresh_app):
    client = fresh_app.test_client()
    log_in(fresh_app, client)
    leave_heartbeats(fresh_app)
    with fresh_app.app_context():
        queue.control_queue().enqueue("shop.jobs.relay", result_ttl=0)  # a job waiting in the control queue
        queue.register_periodic_jobs(60, 600)
    data = client.get("/console/", headers=JSON).get_json()
    assert data["health"]["healthy"] and data["health"]["problems"] == []
    roles = sorted(p["role"] for p in data["processes"])
    assert roles == ["scheduler", "worker"] and not any(p["stalled"] for p in data["processes"])
    assert all(p["beat_age_seconds"] is not None and p["host"] and p["pid"] for p in data["processes"])
    depths = {q["name"]: q for q in data["queues"]}
    control = fresh_app.config["QUEUE_PREFIX"] + "-control"
    assert depths[control]["depth"] == 1 and depths[control]["oldest_age_seconds"] is not None
    assert depths["rq-scheduler"]["depth"] >= 2 and "outbox deliveries" in depths
    assert data["next_sweep_at"] is not None
    html = client.get("/console/").get_data(as_text=True)
    assert "Processes" in html and "Next sweep" in html

    scrape = client.get("/metrics").get_data(as_text=True)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(scrape)
        for s in f.samples
    }
    assert samples[("shop_processes_beating", (("role", "worker"),))] == 1
    assert samples[("shop_processes_beating", (("role", "scheduler"),))] == 1
    assert samples[("shop_queue_depth", (("queue", control),))] == 1
    assert ("shop_outbox_lag_seconds", (("kind", "delivery"),)) in samples
    assert any(name == "shop_process_heartbeat_age_seconds" for name, _ in samples)


# -- real processes -------------------------------------------------------------------------------

STALE = 4


def _stalled_and_named(client, role: str, name: str) -> bool:
    """/healthz is 503 naming the process, and the dashboard lists it stalled."""
    health = client.get("/healthz")
    listed = {p["name"]: p for p in client.get("/console/", headers=JSON).get_json()["processes"]}
    key = "workers" if role == "worker" else "scheduler"
    return health.status_code == 503 and name in health.get_json()[key] and listed.get(name, {}).get("stalled") is True


def _stopped_then_resumed(make_fresh_app, role: str):
    """Start a real worker and scheduler with HEALTH_STALE_SECONDS=4: idle, they stay healthy
    (an idle RQ worker beats only every 405 s by default). SIGSTOP the one of `role`: /healthz
    turns 503 naming it and the dashboard lists it stalled within 4 + 5 s; SIGCONT brings both
    back."""

    app = make_fresh_app(HEALTH_STALE_SECONDS=STALE)
    client = app.test_client()
    log_in(app, client)
    procs = Processes()
    stopped = None
    try:
        # The worker runs shop.jobs' entry points only: run_command, made slow by its failpoint.
        env = process_env(
            app, HEALTH_STALE_SECONDS=str(STALE), BACKSTOP_FAILPOINTS=f"job.run_command=sleep:{2 * STALE}"
        )
        children = {
            "worker": procs.start("worker", ["shop", "worker"], env),
            "scheduler": procs.start("scheduler", ["shop", "scheduler"], env),
        }
        wait_until(lambda: client.get("/healthz").status_code == 200, 60, "a healthy /healthz", procs.logs)
        if role == "worker":
            # Busy for twice the limit: a non-forking worker does not beat while it runs a job
            # unless something beats for it.
            with app.app_context():
                queue.control_queue().enqueue(queue.COMMAND_JOB, 0, job_timeout=60, result_ttl=0)

        def healthy_doing() -> set:
            health = client.get("/healthz")
            assert health.status_code == 200, (health.get_json(), procs.logs())
            return {p["job"] for p in client.get("/console/", headers=JSON).get_json()["processes"]}

        if role == "worker":
            # Healthy from the busy job's start to its end (twice the limit), however late the
            # worker took it on a loaded machine: waited for by what the worker says it does.
            wait_until(lambda: "run_command(0)" in healthy_doing(), 60, "the worker to take the busy job", procs.logs)
            wait_until(
                lambda: "run_command(0)" not in healthy_doing(), 2 * STALE + 30, "the busy job to end", procs.logs
            )
        else:
            quiet_until = time.monotonic() + 2 * STALE + 1  # twice the limit, and a second more
            poll_until(lambda: healthy_doing() is not None and time.monotonic() >= quiet_until, 2 * STALE + 2, 0.2)
        target = children[role]
        [name] = [
            p["name"]
            for p in client.get("/console/", headers=JSON).get_json()["processes"]
            if p["role"] == role and p["pid"] == target.pid
        ]

        os.kill(target.pid, signal.SIGSTOP)
        stopped = target
        started = time.monotonic()
        named = f"/healthz 503 naming the stopped {role}"
        wait_until(lambda: _stalled_and_named(client, role, name), STALE + 5, named, procs.logs)
        assert time.monotonic() - started > STALE - 1  # not before it could have been stale

        os.kill(target.pid, signal.SIGCONT)
        stopped = None

        def healthy_again():
            listed = {p["name"]: p for p in client.get("/console/", headers=JSON).get_json()["processes"]}
            return client.get("/healthz").status_code == 200 and listed.get(name, {}).get("stalled") is False

        wait_until(healthy_again, STALE + 5, f"/healthz 200 after SIGCONT to the {role}", procs.logs)
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        procs.stop()


@pytest.mark.slow
def test_a_stopped_worker_turns_healthz_503_naming_it_and_sigcont_brings_it_back(make_fresh_app):
    _stopped_then_resumed(make_fresh_app, "worker")


@pytest.mark.slow
def test_a_stopped_scheduler_turns_healthz_503_naming_it_and_sigcont_brings_it_back(make_fresh_app):
    _stopped_then_resumed(make_fresh_app, "scheduler")


@pytest.mark.slow
def test_real_processes_of_two_nodes_are_grouped_and_a_killed_node_is_shown_gone(make_fresh_app):
    """`flask shop worker` with BACKSTOP_NODE_NAME=node-a, and a worker and a scheduler with
    node-b: the dashboard and /metrics group them by node, their log lines carry it, and once
    node-a's only process is SIGKILLed (its record stays in Redis) node-a is gone within
    HEALTH_STALE_SECONDS while node-b stays up."""
    app = make_fresh_app(HEALTH_STALE_SECONDS=STALE)
    client = app.test_client()
    log_in(app, client)
    procs = Processes()
    try:
        env = process_env(app, HEALTH_STALE_SECONDS=str(STALE))
        a_worker = procs.start("worker-a", ["shop", "worker"], {**env, "BACKSTOP_NODE_NAME": "node-a"})
        procs.start("worker-b", ["shop", "worker"], {**env, "BACKSTOP_NODE_NAME": "node-b"})
        procs.start("scheduler-b", ["shop", "scheduler"], {**env, "BACKSTOP_NODE_NAME": "node-b"})

        def nodes() -> dict:
            return {n["node"]: n for n in client.get("/console/", headers=JSON).get_json()["nodes"]}

        def both_up():
            found = nodes()
            return (
                {"node-a", "node-b"} <= set(found)
                and all(found[n]["state"] == "up" for n in ("node-a", "node-b"))
                and len(found["node-b"]["processes"]) == 2
            )

        wait_until(both_up, 60, "both nodes up on the dashboard", procs.logs)
        found = nodes()
        assert [(p["role"], p["pid"]) for p in found["node-a"]["processes"]] == [("worker", a_worker.pid)]
        assert sorted(p["role"] for p in found["node-b"]["processes"]) == ["scheduler", "worker"]
        assert all(p["name"].startswith("node-b:") for p in found["node-b"]["processes"])
        scrape = client.get("/metrics").get_data(as_text=True)
        assert 'shop_node_up{node="node-a"} 1.0' in scrape and 'shop_node_up{node="node-b"} 1.0' in scrape

        os.kill(a_worker.pid, signal.SIGKILL)
        a_worker.wait()
        wait_until(lambda: nodes()["node-a"]["state"] == "gone", STALE + 10, "node-a gone", procs.logs)
        found = nodes()
        assert found["node-b"]["state"] == "up"
        assert found["node-a"]["words"].startswith("node node-a: no process has beaten for ")
        # Its worker may have been running a periodic job (the first prune, a sweep cycle) when it
        # died: the words then name the lease it still holds (it lapses by itself), otherwise that
        # it holds nothing.
        words = found["node-a"]["words"]
        assert re.search(r"; gone\. It (holds no work\.|still holds the [a-z]+ lease \(until )", words), words
        scrape = client.get("/metrics").get_data(as_text=True)
        assert 'shop_node_up{node="node-a"} 0.0' in scrape and 'shop_node_up{node="node-b"} 1.0' in scrape
        # Their log lines name the node (rq-scheduler's own line at start, through the shop's format).
        assert " INFO [node-b] rq_scheduler.scheduler Registering birth" in procs.log_of("scheduler-b")
    finally:
        procs.stop()


@pytest.mark.slow
def test_a_worker_stopped_inside_its_write_transaction_is_still_named_by_healthz_and_the_dashboard(
    make_fresh_app, tmp_path
):
    """SIGSTOP lands wherever the worker is: here inside a restore's transaction, after the marker
    is flushed (on SQLite the database's one write lock, on PostgreSQL the rows' locks). /healthz
    and the dashboard, which only read, still answer and name it; SIGCONT lets the restore finish."""
    app = make_fresh_app(HEALTH_STALE_SECONDS=STALE)
    client = app.test_client()
    log_in(app, client)
    with app.app_context():
        skus = seed_catalog_rows()
        order_id = place_order_for({skus["NB-A5-DOT"]: 2}).order_id
        cancel(order_id)
    gate = tmp_path / "go"
    procs = Processes()
    stopped = None
    try:
        held = f"restore_inventory.after_marker_flush=hold:{gate}"
        env = process_env(app, HEALTH_STALE_SECONDS=str(STALE), BACKSTOP_FAILPOINTS=held)
        worker = procs.start("worker", ["shop", "worker"], env)
        procs.start("scheduler", ["shop", "scheduler"], env)  # its poll wakes a drain for the due restore
        inside = "the worker inside the restore's transaction"
        wait_until(lambda: os.path.exists(f"{gate}.held"), 60, inside, procs.logs)
        [name] = [
            p["name"]
            for p in client.get("/console/", headers=JSON).get_json()["processes"]
            if p["role"] == "worker" and p["pid"] == worker.pid
        ]
        os.kill(worker.pid, signal.SIGSTOP)
        stopped = worker
        wait_until(
            lambda: _stalled_and_named(client, "worker", name), STALE + 5, "/healthz 503 naming the worker", procs.logs
        )
        gate.touch()
        os.kill(worker.pid, signal.SIGCONT)
        stopped = None

        def restored() -> bool:
            with app.app_context():
                done = order(order_id).inventory_restored
                db.session.remove()
            return done

        wait_until(restored, 60, "the restore to finish after SIGCONT", procs.logs)
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        procs.stop()
