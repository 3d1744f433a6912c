"""A real worker process SIGKILLed in the middle of the compensation: nothing half-done
survives, and the delivery completes once its lease lapses. The database, not RQ, notices."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest

from compensation_support import cancel, on_hand, order, restore_delivery
from factories import place_order_for, seed_catalog_rows
from shop import queue
from shop.domain.deadlines import as_utc
from shop.extensions import db
from shop.models import OutboxDelivery
from shop.outbox import runner
from shop.outbox.dispatch import run_delivery
from shop.outbox.relay import relay_once
from shop.outbox.subscriptions import SUBSCRIPTIONS
from support import REPO_ROOT, wait_until

pytestmark = pytest.mark.slow

ROOT = str(REPO_ROOT)
FLASK = os.path.join(os.path.dirname(sys.executable), "flask")


@pytest.fixture(autouse=True)
def _only_the_restore_listens_to_cancellations(monkeypatch):
    """These tests use cancelled orders' restores as the sample work; the customer's cancellation
    email (a second handler of OrderCancelled) and the order-placed email would double every count
    without adding a case."""
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["restore_inventory"])
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", [])


def _start_worker(app, tmp_path, failpoints: str | None = None) -> subprocess.Popen:
    """`flask --app app shop worker` as its own process, on this test's database and queues."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKSTOP_")}
    env.update(
        DATABASE_URL=app.config["SQLALCHEMY_DATABASE_URI"],
        REDIS_URL=app.config["REDIS_URL"],
        SECRET_KEY=app.config["SECRET_KEY"],
        BACKSTOP_QUEUE_PREFIX=app.config["QUEUE_PREFIX"],
        BACKSTOP_INSTANCE_PATH=str(tmp_path / "worker-instance"),
    )
    if failpoints:
        env["BACKSTOP_FAILPOINTS"] = failpoints
    return subprocess.Popen(
        [FLASK, "--app", "app", "shop", "worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _feed_until(app, proc, order_id, done, timeout=90.0):
    """Wake a drain for the delivery until `done(row)` or the worker exits. Waking again is
    harmless (a claim is needed to run) and keeps the test independent of whoever else shares
    the Redis database and flushes it."""

    def fed() -> bool:
        row = restore_delivery(order_id)
        if done(row) or proc.poll() is not None:
            return True  # done, or the worker exited (the caller says which it expected)
        if row.status == "pending":
            queue.wake(queue.Drain.DELIVERIES)
        db.session.remove()
        return False

    with app.app_context():
        try:
            wait_until(fed, timeout, "the delivery to be done or the worker to exit", interval=0.3)
        except AssertionError:
            pass  # the caller's own assertions say what the row looks like after `timeout`
        db.session.remove()


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # RQ's warm shutdown
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is None:
        return ""
    with proc.stderr:
        return proc.stderr.read()


def test_a_worker_killed_mid_restore_leaves_nothing_half_done_and_the_delivery_completes_after_its_lease(
    fresh_app, tmp_path
):
    with fresh_app.app_context():
        skus = seed_catalog_rows()
        a5, sand = skus["NB-A5-DOT"], skus["MUG-350-SND"]
        order_id = place_order_for({a5: 3, sand: 2}).order_id
        cancel(order_id)
        delivery_id = restore_delivery(order_id).id
        assert (on_hand(a5), on_hand(sand)) == (37, 10)
        db.session.remove()

    # Killed after the marker is flushed and before the commit.
    proc = _start_worker(fresh_app, tmp_path, failpoints="restore_inventory.after_marker_flush=kill")
    try:
        _feed_until(fresh_app, proc, order_id, done=lambda row: False)
        died_by_itself = proc.poll()  # before _stop, which might have to kill it
    finally:
        stderr = _stop(proc)
    assert died_by_itself == -signal.SIGKILL, (died_by_itself, stderr[-3000:])

    with fresh_app.app_context():
        assert order(order_id).inventory_restored is False
        assert (on_hand(a5), on_hand(sand)) == (37, 10)
        row = restore_delivery(order_id)
        assert (row.status, row.attempts) == ("processing", 1)
        lease_end = as_utc(row.claimed_until)

        # While the dead worker's lease holds, nobody runs the delivery a second time...
        assert relay_once(now=lease_end - timedelta(seconds=1))["deliveries"] == 0
        assert run_delivery(delivery_id, now=lease_end - timedelta(seconds=1)) == "skipped"
        # ...once it lapses, the relay hands it to Redis again and a worker finishes it, once.
        later = lease_end + timedelta(seconds=1)
        assert relay_once(now=later)["deliveries"] == 1
        assert run_delivery(delivery_id, now=later) == "done"
        assert run_delivery(delivery_id, now=later + timedelta(minutes=5)) == "skipped"

        assert (on_hand(a5), on_hand(sand)) == (40, 12)
        assert order(order_id).inventory_restored is True
        row = restore_delivery(order_id)
        assert (row.status, row.attempts) == ("done", 2)
        db.session.remove()


def test_a_healthy_worker_process_completes_the_restore(fresh_app, tmp_path):
    """The same path without the failpoint, so the test above fails for the crash, not the setup."""
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 3}).order_id
        cancel(order_id)
        db.session.remove()

    proc = _start_worker(fresh_app, tmp_path)
    try:
        _feed_until(fresh_app, proc, order_id, done=lambda row: row.status == "done")
    finally:
        stderr = _stop(proc)
    assert proc.returncode == 0, stderr[-3000:]

    with fresh_app.app_context():
        assert on_hand(a5) == 40
        assert order(order_id).inventory_restored is True
        row = restore_delivery(order_id)
        assert (row.status, row.attempts) == ("done", 1)
        db.session.remove()


def test_a_worker_lost_on_the_final_attempt_is_dead_lettered_by_the_relay(make_fresh_app, caplog):
    """A claim nobody finishes is exactly what a killed worker leaves behind."""
    app = make_fresh_app(OUTBOX_MAX_ATTEMPTS=1)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 3}).order_id
        cancel(order_id)
        delivery_id = restore_delivery(order_id).id
        now = as_utc(restore_delivery(order_id).next_attempt_at)
        assert runner.claim(OutboxDelivery, delivery_id, now, "worker-that-died")

        later = now + timedelta(seconds=app.config["OUTBOX_LEASE_SECONDS"] + 1)
        counts = relay_once(now=later)
        assert (counts["dead"], counts["deliveries"]) == (1, 0)
        row = restore_delivery(order_id)
        assert row.status == "dead" and "lease lapsed" in row.last_error
        assert any(r.levelname == "ERROR" and "dead letter" in r.getMessage() for r in caplog.records)
        assert on_hand(a5) == 37
        db.session.remove()
