"""A stalled worker is seen within seconds (docs/REFERENCE.md, Console: "Work waiting"; Operations:
/healthz): a real `flask shop worker` stopped by SIGSTOP while orders are placed turns /healthz 503
naming it within its pulse's few seconds (HEALTH_STALE_SECONDS left at its default of 60), and the
"Work waiting" card red naming it once the work behind it has waited over 15 s; SIGCONT brings both
back."""

from __future__ import annotations

import os
import signal

import pytest

from compensation_support import cancel_in
from factories import place_order_for, seed_catalog_rows
from process_support import Processes, process_env, stop_between_writes
from shop import queue
from shop.ops.waiting import WAITING_LIMIT_SECONDS
from support import log_in, wait_until

JSON = {"Accept": "application/json"}


@pytest.mark.slow
def test_a_stopped_worker_turns_the_waiting_card_red_naming_it_and_healthz_503_and_sigcont_clears_both(
    make_fresh_app,
):
    app = make_fresh_app()
    assert app.config["HEALTH_STALE_SECONDS"] == 60  # the default: the pulse, not this, finds the stall
    client = app.test_client()
    log_in(app, client)
    procs = Processes()
    stopped = None
    try:
        # Each order's payment window is 3 s (process_env): its deadline falls due while the worker is stopped.
        env = process_env(app)
        worker = procs.start("worker", ["shop", "worker"], env)
        procs.start("scheduler", ["shop", "scheduler"], env)

        def dashboard() -> dict:
            return client.get("/console/", headers=JSON).get_json()

        def waiting() -> dict:
            return next(c for c in dashboard()["cards"] if c["key"] == "waiting")

        wait_until(lambda: client.get("/healthz").status_code == 200, 60, "a healthy /healthz", procs.logs)
        [name] = [p["name"] for p in dashboard()["processes"] if p["role"] == "worker" and p["pid"] == worker.pid]
        with app.app_context():
            seed_catalog_rows()
        stop_between_writes(worker, app.config["SQLALCHEMY_DATABASE_URI"])  # it is idle: the orders come next
        stopped = worker
        with app.app_context():
            placed = [place_order_for().order_id for _ in range(3)]
        for order_id in placed[:2]:
            cancel_in(app, order_id)  # a cancel's restore is a delivery due at once

        def healthz_names_it() -> bool:
            r = client.get("/healthz")
            return r.status_code == 503 and name in r.get_json()["workers"]

        wait_until(healthz_names_it, 15, "/healthz 503 naming the stopped worker", procs.logs)
        node = next(n for n in dashboard()["nodes"] if any(p["name"] == name for p in n["processes"]))
        # Its scheduler beats on: the node is not up, and says which of its processes stalled.
        assert node["state"] == "stalled" and not node["up"]
        assert f"stalled: worker {name} (pid {worker.pid}, last beat " in node["words"]

        def card_red_naming_it() -> bool:
            c = waiting()
            return c["ok"] is False and f"{name} (node " in c["words"] and f"pid {worker.pid}, stalled" in c["words"]

        def logs_and_card() -> str:
            return procs.logs() + f"\n--- the card ---\n{waiting()}"

        wait_until(card_red_naming_it, WAITING_LIMIT_SECONDS + 20, "the waiting card red naming it", logs_and_card)
        c = waiting()
        assert c["items"][0]["age_seconds"] > WAITING_LIMIT_SECONDS

        os.kill(worker.pid, signal.SIGCONT)
        stopped = None

        def all_clear() -> bool:
            return client.get("/healthz").status_code == 200 and waiting()["ok"] is True

        wait_until(all_clear, 30, "/healthz 200 and the waiting card green after SIGCONT", procs.logs)
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        procs.stop()


@pytest.mark.slow
def test_a_worker_stopped_in_its_start_after_registering_is_named_by_its_pulse_not_60_s_later(make_fresh_app, tmp_path):
    """Registered means counted as alive, so the pulse starts there: a worker stopped between its
    registration and its first listen (here held at its subscription, then SIGSTOP) already has a
    pulse, and /healthz names it stalled within the pulse's seconds, long before its full beat is
    HEALTH_STALE_SECONDS (60 s) old."""
    app = make_fresh_app()
    client = app.test_client()
    log_in(app, client)
    procs = Processes()
    hold = str(tmp_path / "hold")
    stopped = None
    try:
        env = process_env(app, BACKSTOP_FAILPOINTS=f"worker.start.subscribe=hold:{hold}")
        worker = procs.start("worker", ["shop", "worker"], env)
        wait_until(lambda: os.path.exists(hold + ".held"), 60, "the worker to reach its subscription", procs.logs)
        [name] = [
            p["name"]
            for p in client.get("/console/", headers=JSON).get_json()["processes"]
            if p["role"] == "worker" and p["pid"] == worker.pid
        ]
        with app.app_context():
            assert name in queue.pulses(), "a registered worker has no pulse yet"
        os.kill(worker.pid, signal.SIGSTOP)
        stopped = worker

        def healthz_names_it() -> bool:
            r = client.get("/healthz")
            return r.status_code == 503 and name in r.get_json()["workers"]

        wait_until(healthz_names_it, app.config["HEALTH_STALE_SECONDS"] * 0.75, "/healthz 503 naming it", procs.logs)
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        open(hold, "w").close()
        procs.stop()
