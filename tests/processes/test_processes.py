"""End to end with real processes: `flask shop stripe-sandbox`, `flask shop scheduler` and
`flask shop worker` as the deployment runs them (Procfile), against the test database and Redis.
An unpaid order placed with a 3-second window must be cancelled, its stock back, within 3 s of
its deadline, with nothing but those processes doing the work."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from datetime import timedelta, timezone

import pytest
from redis import Redis
from redis.exceptions import RedisError
from rq import Worker
from rq.job import JobStatus
from sqlalchemy import select, update

from factories import on_hand, place_order_for, seed_catalog_rows, variant_id
from process_support import (
    ROOT,
    WINDOW,
    Processes,
    flask_command,
    free_port,
    process_env,
    start_redis_server,
)
from shop import queue
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import Order, OutboxDelivery, OutboxEvent, ScheduledCommand
from shop.orders.cancel import PROVIDER_EXPIRY_GRACE
from shop.payments.start import start_payment
from shop.queue.connection import ShopQueue
from support import UNREACHABLE_PROVIDER, wait_until

pytestmark = pytest.mark.slow


def _checkout(quantity: int) -> tuple[int, int]:
    seed_catalog_rows()
    return place_order_for({"NB-A5-DOT": quantity}).order_id, variant_id("NB-A5-DOT")


def _cancelled_and_restored(order_id: int):
    """A check for wait_until: the order is Cancelled and its stock is back (read fresh each time)."""

    def check() -> bool:
        db.session.expire_all()
        order = db.session.get(Order, order_id)
        done = order.status == "Cancelled" and order.inventory_restored
        db.session.rollback()
        return done

    return check


@pytest.mark.parametrize("at_payment_page", [False, True], ids=["pending", "at_the_payment_page"])
def test_real_scheduler_and_worker_cancel_an_unpaid_order_within_3s_of_its_deadline(make_fresh_app, at_payment_page):
    """pending: the order never reached the provider. at_the_payment_page: the customer left the
    hosted page open; its session lives until the order's pay-by, no web server takes the
    expired webhook, and the deadline itself asks the provider."""
    port = free_port()
    sandbox_url = f"http://127.0.0.1:{port}"
    app = make_fresh_app(
        UNPAID_ORDER_EXPIRY_SECONDS=WINDOW,
        RECONCILIATION_STUCK_AGE_SECONDS=WINDOW,
        STRIPE_API_BASE=sandbox_url,
        STRIPE_SESSION_MIN_SECONDS=1,
    )
    procs = Processes()
    try:
        env = process_env(app, STRIPE_API_BASE=sandbox_url)
        procs.start("sandbox", ["shop", "stripe-sandbox", "--port", str(port), "--min-session-seconds", "1"], env)
        procs.start("scheduler", ["shop", "scheduler"], env)
        procs.start("worker", ["shop", "worker"], env)

        with app.app_context():

            def sandbox_up():
                with socket.socket() as s:
                    return s.connect_ex(("127.0.0.1", port)) == 0

            wait_until(sandbox_up, 20, "the sandbox", procs.logs)
            wait_until(lambda: Worker.all(queue=queue.work_queue()), 20, "the worker", procs.logs)
            prefix = app.config["QUEUE_PREFIX"]

            def start_up_sweep_done():
                # The scheduler registers the sweep due now; wait until it ran once (the job is
                # back in the schedule an interval ahead and the control queue is drained), so
                # the cancellation below can only come from the order's own deadline.
                for job, at in queue.scheduler().get_jobs(with_times=True):
                    if job.id == f"{prefix}-periodic-reconcile":
                        return (
                            at.replace(tzinfo=timezone.utc).timestamp() - time.time() > 600
                            and queue.control_queue().count == 0
                            and all(w.get_state() == "idle" for w in Worker.all(queue=queue.work_queue()))
                        )
                return False

            wait_until(start_up_sweep_done, 20, "the scheduler's start", procs.logs)

            order_id, variant_id = _checkout(quantity=3)
            placed = db.session.get(Order, order_id)
            due = as_utc(placed.created_at) + timedelta(seconds=WINDOW)
            db.session.rollback()
            if at_payment_page:
                assert start_payment(order_id).status == "started"
                # Its pay-by is now the session's expires_at (the provider's shortest lifetime
                # plus slack may put it past the window): the deadline waits for it, and gives
                # the provider a moment to expire the session by its own clock.
                due = as_utc(db.session.get(Order, order_id).payment_session_expires_at) + PROVIDER_EXPIRY_GRACE
                db.session.rollback()
            assert on_hand(variant_id) == 37

            # Bounded: the deadline plus 3 s, polled every 100 ms.
            bound = (due + timedelta(seconds=3) - utcnow()).total_seconds()
            wait_until(
                _cancelled_and_restored(order_id),
                bound,
                "the deadline to cancel the order and restore its stock",
                procs.logs,
            )

            order = db.session.get(Order, order_id)
            lateness = (as_utc(order.updated_at) - due).total_seconds()
            assert lateness <= 3.0, procs.logs()
            assert on_hand(variant_id) == 40
            deadline = db.session.execute(
                select(ScheduledCommand).where(
                    ScheduledCommand.kind == "expire_unpaid_order", ScheduledCommand.order_id == order_id
                )
            ).scalar_one()
            assert deadline.status == "done"
            if at_payment_page:
                assert deadline.attempts == 1  # rescheduled to the session's end, not retried
            reason = db.session.execute(
                select(OutboxEvent.payload).where(
                    OutboxEvent.order_id == order_id, OutboxEvent.name == "OrderCancelled"
                )
            ).scalar_one()["reason"]
            assert reason == "payment window expired"  # the order's own deadline did it, not the sweep
            db.session.remove()
            for name, proc in procs.children:
                assert proc.poll() is None, f"{name} exited early\n{procs.logs()}"
    finally:
        procs.stop()


def test_a_running_scheduler_rebuilds_redis_from_the_database_when_redis_loses_everything(make_fresh_app, redis_conn):
    """Redis restarted empty (or flushed) under a running scheduler: the periodic relay and sweep
    are gone. The scheduler notices on its next poll and registers them again from the database,
    without being restarted; the deadline of an order placed before needed nothing from Redis
    (the poll finds it in the database): the order is still cancelled about on time and its
    stock comes back."""
    app = make_fresh_app(UNPAID_ORDER_EXPIRY_SECONDS=WINDOW, RECONCILIATION_STUCK_AGE_SECONDS=WINDOW)
    procs = Processes()
    try:
        env = process_env(app, STRIPE_API_BASE=UNREACHABLE_PROVIDER)
        procs.start("scheduler", ["shop", "scheduler"], env)
        procs.start("worker", ["shop", "worker"], env)
        with app.app_context():
            prefix = app.config["QUEUE_PREFIX"]
            periodic = {f"{prefix}-periodic-relay", f"{prefix}-periodic-reconcile"}

            def registered():
                return periodic <= {job.id for job in queue.scheduler().get_jobs()}

            wait_until(registered, 20, "the scheduler's periodic jobs", procs.logs)
            wait_until(lambda: Worker.all(queue=queue.work_queue()), 20, "the worker", procs.logs)
            order_id, variant_id = _checkout(quantity=2)
            placed = db.session.get(Order, order_id)
            due = as_utc(placed.created_at) + timedelta(seconds=WINDOW)
            db.session.rollback()
            redis_conn.flushdb()  # everything Redis held is gone: relay, sweep, workers' keys

            wait_until(registered, 10, "the scheduler to register its periodic jobs again", procs.logs)

            bound = (due + timedelta(seconds=5) - utcnow()).total_seconds()
            wait_until(
                _cancelled_and_restored(order_id), max(bound, 1), "the lost deadline to cancel the order", procs.logs
            )
            assert on_hand(variant_id) == 40
            db.session.remove()
            assert "rebuilding them from the database" in procs.logs()
            for name, proc in procs.children:
                assert proc.poll() is None, f"{name} exited early\n{procs.logs()}"
    finally:
        procs.stop()


def test_the_scheduler_waits_out_a_redis_restart_and_then_rebuilds_what_redis_lost(make_fresh_app, tmp_path):
    """Redis goes away and comes back empty (a restart without persistence): the scheduler
    neither dies with a traceback nor carries on without its periodic jobs."""
    port = free_port()

    def start_redis() -> subprocess.Popen:
        return start_redis_server(port, str(tmp_path))

    redis_server = start_redis()
    app = make_fresh_app(REDIS_URL=f"redis://127.0.0.1:{port}/0")
    procs = Processes()
    try:
        scheduler = procs.start("scheduler", ["shop", "scheduler"], process_env(app))
        with app.app_context():
            prefix = app.config["QUEUE_PREFIX"]

            def registered():
                try:
                    return f"{prefix}-periodic-relay" in {job.id for job in queue.scheduler().get_jobs()}
                except Exception:  # Redis is down for part of this test
                    return False

            wait_until(registered, 20, "the scheduler's periodic jobs", procs.logs)
            redis_server.terminate()
            redis_server.wait(timeout=10)
            time.sleep(3)  # a sleep: the outage's length (a few polls against nothing) is the fault itself
            assert scheduler.poll() is None, procs.logs()
            redis_server = start_redis()
            wait_until(registered, 20, "the periodic jobs to be registered again", procs.logs)
            assert scheduler.poll() is None, procs.logs()
            logs = procs.logs()
            assert "waiting for it" in logs and "rebuilding them from the database" in logs
            assert "Traceback" not in logs
    finally:
        procs.stop()
        redis_server.terminate()
        redis_server.wait(timeout=10)


def test_a_worker_refuses_to_start_when_the_stuck_age_differs_from_the_window(make_fresh_app):
    app = make_fresh_app()
    env = process_env(app, RECONCILIATION_STUCK_AGE_SECONDS="600", UNPAID_ORDER_EXPIRY_SECONDS="1800")
    done = subprocess.run(
        flask_command() + ["--app", "app", "shop", "worker", "--burst"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    [line] = [text for text in done.stderr.splitlines() if text.strip()]  # one clear line, no traceback
    assert "RECONCILIATION_STUCK_AGE_SECONDS" in line


def test_a_worker_and_a_scheduler_started_while_redis_is_down_wait_for_it_instead_of_exiting(make_fresh_app, tmp_path):
    """A node that boots while Redis restarts, or while Sentinel fails over, must not leave its
    worker and scheduler dead: each says what it waits for, and runs once Redis answers."""
    port = free_port()
    app = make_fresh_app()
    procs = Processes()
    redis_server = None
    try:
        env = process_env(app, REDIS_URL=f"redis://127.0.0.1:{port}/0")  # nothing answers there yet
        worker = procs.start("worker", ["shop", "worker"], env)
        scheduler = procs.start("scheduler", ["shop", "scheduler"], env)
        wait_until(lambda: procs.logs().count("waiting for Redis (REDIS_URL)") >= 2, 30, "both to wait", procs.logs)
        time.sleep(1)  # a sleep: how long they wait for Redis is the fault; they log only every 10 s
        assert worker.poll() is None and scheduler.poll() is None, procs.logs()
        redis_server = start_redis_server(port, str(tmp_path))
        started = Redis(host="127.0.0.1", port=port)
        wait_until(lambda: _answers(started) and started.smembers("rq:workers"), 30, "the worker", procs.logs)
        wait_until(lambda: "scheduler polling" in procs.logs(), 30, "the scheduler to poll", procs.logs)
        assert worker.poll() is None and scheduler.poll() is None, procs.logs()
    finally:
        procs.stop()
        if redis_server is not None:
            redis_server.kill()
            redis_server.wait(timeout=5)


# RQ's words for each wait between two tries at reaching Redis (rq.worker, its dequeue loop).
RETRY_WAIT = re.compile(r"could not connect to Redis instance: .*? retrying in (\d+) seconds")


def test_a_worker_is_back_at_work_within_seconds_of_redis_answering_again_after_a_long_absence(
    make_fresh_app, tmp_path
):
    """Redis is away for 16 s (a restart, a slow failover) and comes back empty: the worker,
    which kept trying all along, registers again within a few seconds, not after a wait that
    grew with the absence (RQ's own doubles up to 60 s: here it would be 15 s more)."""
    port = free_port()
    app = make_fresh_app()
    procs = Processes()
    redis_server = start_redis_server(port, str(tmp_path))
    try:
        worker = procs.start("worker", ["shop", "worker"], process_env(app, REDIS_URL=f"redis://127.0.0.1:{port}/0"))
        conn = Redis(host="127.0.0.1", port=port)
        # Listening (RQ's state "idle"), past its start: Redis lost during the start itself is
        # not this test's case.
        wait_until(
            lambda: any(conn.hget(key, "state") == b"idle" for key in conn.smembers("rq:workers")),
            30,
            "the worker to register and listen",
            procs.logs,
        )
        redis_server.kill()
        redis_server.wait(timeout=5)
        time.sleep(16)  # a sleep: Redis gone past the worker's reconnect attempts is the fault itself
        assert worker.poll() is None, procs.logs()
        redis_server = start_redis_server(port, str(tmp_path))
        wait_until(lambda: _answers(conn), 10, "Redis to answer again")
        wait_until(lambda: conn.smembers("rq:workers"), 30, "the worker to register again", procs.logs)
        # Back within seconds because it tried every 2 s at most all along: the waits it took
        # between tries never grew past that (RQ's own would have reached 16 s by now).
        waits = [int(n) for n in RETRY_WAIT.findall(procs.logs())]
        assert waits and max(waits) <= 2, f"waits between tries {waits}\n{procs.logs()}"
    finally:
        procs.stop()
        redis_server.kill()
        redis_server.wait(timeout=5)


# Each step of RQ's start, in order: before the birth record, before the pubsub channel (the
# birth is in Redis), before the first state is written, and once listening (the loop's first
# suspension check meets the failure). Redis either comes back empty (a restart) or with what it
# had (a Sentinel failover promotes a replica that has the birth record, and RQ refuses a name
# whose record says it is alive).
_START_STEPS = ["register_birth", "subscribe", "set_state", "listening"]


@pytest.mark.parametrize(
    "step,kept",
    [(step, False) for step in _START_STEPS] + [("subscribe", True), ("listening", True)],
    ids=[f"{step}-empty" for step in _START_STEPS] + ["subscribe-kept", "listening-kept"],
)
def test_a_worker_whose_redis_goes_away_at_any_step_of_its_start_waits_and_comes_back_to_work(
    make_fresh_app, tmp_path, step, kept
):
    """The worker is held at one step of its start (a failpoint, no clock), Redis goes away there,
    then the worker goes on into the failure: it must stay up, say it waits for Redis, and once
    Redis answers again register, listen and run a job."""
    port = free_port()
    app = make_fresh_app()
    procs = Processes()
    hold = str(tmp_path / "hold")
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    redis_server = start_redis_server(port, str(redis_dir))
    conn = Redis(host="127.0.0.1", port=port)
    try:
        wait_until(lambda: _answers(conn), 10, "the throwaway Redis to answer")
        env = process_env(
            app, REDIS_URL=f"redis://127.0.0.1:{port}/0", BACKSTOP_FAILPOINTS=f"worker.start.{step}=hold:{hold}"
        )
        worker = procs.start("worker", ["shop", "worker"], env)
        # With `kept`, the restarted Redis loads what it had: what a promoted replica already had.
        _redis_goes_away_at_the_hold(procs, worker, "worker", step, hold, redis_server, conn if kept else None)
        redis_server = start_redis_server(port, str(redis_dir))
        wait_until(lambda: _answers(conn), 10, "Redis to answer again")
        wait_until(
            lambda: any(conn.hget(key, "state") == b"idle" for key in conn.smembers("rq:workers")),
            30,
            "the worker to register and listen again",
            procs.logs,
        )
        job = ShopQueue(queue_names_for(app)[1], connection=conn).enqueue("shop.jobs.relay")
        wait_until(
            lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, "the worker to run a job", procs.logs
        )
        assert worker.poll() is None, procs.logs()
    finally:
        procs.stop()
        redis_server.kill()
        redis_server.wait(timeout=5)


@pytest.mark.parametrize("step", ["register", "relay"])
def test_a_scheduler_whose_redis_goes_away_while_it_rebuilds_at_its_start_waits_and_registers_its_jobs(
    make_fresh_app, tmp_path, step
):
    """The scheduler's start writes Redis's part from the database (its periodic jobs, then a drain
    for what is due) after Redis first answered. Held at a step of that (a failpoint, no clock),
    Redis goes away there: the scheduler once exited with code 1 (a loaded run saw it, Redis taken
    away while the periodic jobs were still being registered). It must wait and then register."""
    port = free_port()
    app = make_fresh_app(REDIS_URL=f"redis://127.0.0.1:{port}/0")
    procs = Processes()
    hold = str(tmp_path / "hold")
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    with app.app_context():
        # An order whose deliveries were never announced (a crash before the commit's hook):
        # the start's drain for what is due has work to announce, so it writes to Redis.
        place_order_for({next(iter(sorted(seed_catalog_rows().values()))): 1})
        db.session.execute(update(OutboxDelivery).values(enqueued_at=None))
        db.session.commit()
        db.session.remove()
    redis_server = start_redis_server(port, str(redis_dir))
    conn = Redis(host="127.0.0.1", port=port)
    try:
        wait_until(lambda: _answers(conn), 10, "the throwaway Redis to answer")
        env = process_env(app, BACKSTOP_FAILPOINTS=f"scheduler.rebuild.{step}=hold:{hold}")
        scheduler = procs.start("scheduler", ["shop", "scheduler"], env)
        _redis_goes_away_at_the_hold(procs, scheduler, "scheduler", step, hold, redis_server)
        redis_server = start_redis_server(port, str(redis_dir))
        with app.app_context():
            prefix = app.config["QUEUE_PREFIX"]
            wanted = {f"{prefix}-periodic-relay", f"{prefix}-periodic-reconcile", f"{prefix}-periodic-prune"}

            def registered():
                try:
                    return wanted <= {job.id for job in queue.scheduler().get_jobs()}
                except RedisError:
                    return False

            wait_until(registered, 30, "the periodic jobs in the Redis that came back", procs.logs)
        wait_until(lambda: "scheduler polling every" in procs.logs(), 30, "the scheduler to poll", procs.logs)
        assert scheduler.poll() is None, procs.logs()
        assert "Traceback" not in procs.logs()
    finally:
        procs.stop()
        redis_server.kill()
        redis_server.wait(timeout=5)


def _redis_goes_away_at_the_hold(procs, proc, role: str, step: str, hold: str, redis_server, saved=None) -> None:
    """`proc`, held at `step` of its start (a `hold:` failpoint at `hold`), meets Redis gone there:
    Redis is killed (after `saved`, a connection to it, has it write its data for the restart),
    the process goes on into the failure, and must stay up saying that it waits for Redis."""
    wait_until(lambda: os.path.exists(hold + ".held"), 60, f"the {role} to reach {step}", procs.logs)
    if saved is not None:
        saved.save()
    redis_server.kill()
    redis_server.wait(timeout=5)
    open(hold, "w").close()
    wait_until(lambda: "waiting for Redis (REDIS_URL)" in procs.logs(), 30, f"the {role} to wait", procs.logs)
    assert proc.poll() is None, procs.logs()


def queue_names_for(app) -> tuple[str, str]:
    with app.app_context():
        return queue.queue_names()


def _answers(conn) -> bool:
    try:
        return bool(conn.ping())
    except (RedisError, OSError):
        return False
