"""The sweep's lease across real processes: a `flask shop sweep` killed with SIGKILL in the middle
of its cycle, and a real scheduler and worker that take the cycle over.

Run the holder on "another machine" (its own UTS namespace with another host name, so nothing
here can look its pid up: `holder_is_gone` says alive), and its lease is only noticed when it
lapses; the scheduler's watch then queues a cycle and the worker's cycle takes the lease over,
within the lease plus a poll. Run it on this machine and the pid check takes it over at the next
poll. Without the watch nothing would start a cycle before the next interval (an hour here)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from datetime import timedelta

import pytest
from rq import Worker
from sqlalchemy import func, select

from factories import force_order, place_order_for, seed_catalog_rows
from process_support import ROOT, Processes, flask_command, process_env
from shop import queue
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Lease, Order, OutboxEvent, ReconciliationCycle
from shop.scheduling.lease import LEASE_NAME
from support import wait_until

pytestmark = pytest.mark.slow

LEASE = 3
POLL = 1
WINDOW = 3600  # the orders' own deadlines stay an hour away: only the sweep cancels them


def _can_fake_another_machine() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def _cycles() -> list:
    """(id, status, holder, notes, started_at) of every cycle: plain rows, not objects whose attributes would
    be reloaded after the rollback (a read that, on SQLite, holds the write lock until the next)."""
    c = ReconciliationCycle
    rows = db.session.execute(select(c.id, c.status, c.holder, c.notes, c.started_at).order_by(c.id)).all()
    db.session.rollback()
    return rows


def _cancelled(ids) -> int:
    n = db.session.execute(select(func.count()).where(Order.id.in_(ids), Order.status == "Cancelled")).scalar_one()
    db.session.rollback()
    return n


def _lease_expiry():
    expires_at = db.session.execute(select(Lease.expires_at).where(Lease.name == LEASE_NAME)).scalar()
    db.session.rollback()
    return expires_at


def _lease_holder() -> str | None:
    holder = db.session.execute(select(Lease.holder).where(Lease.name == LEASE_NAME)).scalar()
    db.session.rollback()
    return holder


@pytest.mark.parametrize("where", ["another_machine", "this_machine"])
def test_a_sweep_killed_mid_cycle_is_taken_over_by_the_scheduler_and_a_worker(make_fresh_app, where):
    if where == "another_machine" and not _can_fake_another_machine():
        pytest.skip("needs root and unshare(1) to run the holder under another host name")
    app = make_fresh_app(UNPAID_ORDER_EXPIRY_SECONDS=WINDOW, RECONCILIATION_STUCK_AGE_SECONDS=WINDOW)
    seed_catalog_rows(app)
    env = process_env(
        app, window=WINDOW, SCHEDULER_POLL_SECONDS=str(POLL), BACKSTOP_RECONCILIATION_LEASE_SECONDS=str(LEASE)
    )
    procs = Processes()
    holder_proc = None
    try:
        procs.start("scheduler", ["shop", "scheduler"], env)
        procs.start("worker", ["shop", "worker"], env)
        with app.app_context():
            wait_until(lambda: Worker.all(queue=queue.work_queue()), 20, "the worker", procs.logs)
            # The scheduler's first cycle runs at its start; let it finish before there is work.
            wait_until(lambda: any(c.status == "ok" for c in _cycles()), 30, "the start-up cycle", procs.logs)
            ids = [place_order_for().order_id for _ in range(8)]
            for order_id in ids:
                force_order(order_id, updated_at=utcnow() - timedelta(hours=2))

            # The holder: one cycle whose every order takes a second.
            command = flask_command() + ["--app", "app", "shop", "sweep"]
            if where == "another_machine":
                command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', "other-node"] + command
            holder_proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**env, "BACKSTOP_FAILPOINTS": "sweep.after_order=sleep:1"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            wait_until(lambda: _cancelled(ids) >= 1, 30, "the holder's first order", procs.logs)
            holder = _lease_holder()
            assert holder is not None and holder.split(":")[1] == str(holder_proc.pid), holder
            if where == "another_machine":
                assert holder.startswith("other-node:"), holder
            [its_cycle] = [c.id for c in _cycles() if c.holder == holder]
            os.kill(holder_proc.pid, signal.SIGKILL)
            holder_proc.wait(timeout=10)
            done_by_holder = _cancelled(ids)
            assert done_by_holder < len(ids)
            # Where the dead holder's lease ended: nothing renews it now, and on another machine
            # nothing may take it before then.
            lapses_at = _lease_expiry() if where == "another_machine" else None

            def taken_over():
                return [c for c in _cycles() if c.id > its_cycle and c.status != "skipped"]

            # Within the wait only because the watch queued a cycle: the next by the interval is
            # an hour away.
            [takeover, *_] = wait_until(taken_over, LEASE + POLL + 30, "another cycle", procs.logs)
            assert takeover.holder != holder
            notes = " ".join(takeover.notes or [])
            if where == "another_machine":
                # Not by the pid: the lease had to lapse, and the cycle took it only after.
                assert lapses_at is not None and takeover.started_at >= lapses_at, (lapses_at, takeover)
                assert "took over" not in notes, notes
            else:
                # By the pid, at once: the note says so (a lapsed lease is taken without one).
                assert f"took over the sweep lease of {holder}" in notes, notes

            wait_until(lambda: _cancelled(ids) == len(ids), 30, "every order cancelled", procs.logs)
            cancels = (
                db.session.execute(select(OutboxEvent.order_id).where(OutboxEvent.name == "OrderCancelled"))
                .scalars()
                .all()
            )
            db.session.rollback()
            assert sorted(cancels) == sorted(ids), "each order cancelled exactly once"
            db.session.remove()
            for name, proc in procs.children:
                assert proc.poll() is None, f"{name} exited early\n{procs.logs()}"
    finally:
        if holder_proc is not None and holder_proc.poll() is None:
            holder_proc.kill()
            holder_proc.wait(timeout=10)
        procs.stop()
