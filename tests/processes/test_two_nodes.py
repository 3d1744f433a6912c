"""Two full nodes on one PostgreSQL and one Redis behind nginx, and one of them dies.

Each node is the Procfile's web, worker and scheduler in its own UTS namespace with its own host
name (tests/cluster_support.py). Customers check out through nginx, so their requests land on
both nodes, and pay, abandon (the session expires; or an async payment fails and only the
deadline ends the order), cancel, or pay late (money for an order they cancelled: refunded).
Mid-load every process of one node is SIGKILLed at once (the node whose scheduler last moved due
jobs, at the first moment its processes hold work in the database, while the provider answers
slowly so that the work held is a provider call), the customers go on against
the survivor, and after quiet the guarantees are checked from the database and the provider's
objects (docs/REFERENCE.md, Guarantees): stock conserved, each cancelled order restored exactly
once, every paid session kept or refunded once, every abandoned order expired, the deadlines due
after the kill late by at most 20 s, and the dead node's claimed work and the sweep taken over
within 30 s. PostgreSQL only; needs root (unshare --uts) and nginx. About 2-3 minutes."""

from __future__ import annotations

import os
import time

import pytest

from cluster_support import (
    Cluster,
    Customers,
    check_guarantees,
    kill_when_busy,
    measure_takeover,
    wait_for_quiet,
    why_no_cluster,
)

DATABASE_URL = os.environ.get("DATABASE_URL", "")

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

WINDOW = 20  # the payment window = the stuck age = the sandbox's shortest session (about)
CUSTOMERS = 6
BEFORE_KILL = 25  # seconds of load on both nodes
KILL_WATCH = 10  # then kill at the first moment the victim holds work (at most this much later)
PROVIDER_LATENCY = 0.5  # seconds each provider call takes while the kill waits for its moment
AFTER_KILL = 20  # seconds of load on the survivor
QUIET_TIMEOUT = 120  # the claims of the dead node lapse after 60 s, then the relay hands them on
STOCK = {"NB-A5-DOT": 5000, "NB-A6-DOT": 5000, "MUG-350-SND": 5000, "SOCK-M": 5000}


def test_two_nodes_one_dies_and_every_guarantee_holds():
    if not DATABASE_URL.startswith("postgres"):
        pytest.skip("two nodes share one PostgreSQL database (SQLite is one process's file)")
    reason = why_no_cluster()
    if reason:
        pytest.skip(reason)
    budgets = {"STRIPE_RATE_LIMIT_PER_SECOND": "2000", "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND": "1000"}
    with Cluster(
        ("node-a", "node-b"), window=WINDOW, server_url=DATABASE_URL, env=budgets, label="twonodes"
    ) as cluster:
        initial = cluster.set_stock(STOCK)
        customers = Customers(cluster, CUSTOMERS, seed=int(time.time()))
        load_started = time.time()
        customers.start()
        try:
            time.sleep(BEFORE_KILL)  # a sleep: the load's length before the kill is the scenario itself
            victim = cluster.scheduler_lock_node() or "node-a"
            before_kill = time.time()
            # A slow provider for the moments around the kill: the node then dies in the middle of
            # provider calls (a deadline asking about its session, a refund, the sweep's watch of
            # late money), holding their claims and maybe the sweep's lease, not between them.
            cluster.sandbox("POST", "/_sandbox/faults", {"api_latency_seconds": PROVIDER_LATENCY})
            try:
                killed_at, orphaned, moment = kill_when_busy(cluster, victim, within=KILL_WATCH)
            finally:
                cluster.sandbox("POST", "/_sandbox/faults", {"api_latency_seconds": 0})
            time.sleep(AFTER_KILL)  # a sleep: the survivor's time under load is the scenario itself
        finally:
            customers.stop()
        quiet, waited, busy = wait_for_quiet(
            cluster.sql, QUIET_TIMEOUT, log_path=os.path.join(cluster.workdir, "quiet.log")
        )
        takeover = measure_takeover(cluster, customers, killed_at, orphaned)
        checks = check_guarantees(cluster, customers, initial, killed_at, takeover)

        served = cluster.requests_per_node(load_started, before_kill)
        survivor = next(n for n in cluster.nodes if n != victim)
        placed_after = customers.placed(since=killed_at.timestamp())
        by_kind = {}
        for j in customers.journeys:
            by_kind.setdefault(j.kind, [0, 0])[0 if j.ref else 1] += 1
        lines = [
            f"killed {victim} {moment}; it held at death: "
            + ", ".join(f"{len(v)} {k}" for k, v in orphaned.items())
            + f"; requests before the kill per node: {dict(served)}",
            f"journeys (placed, not placed): {by_kind}; orders placed after the kill: {placed_after}",
            f"what customers saw: {dict(customers.notes)}",
            f"logs: {cluster.workdir}",
            f"quiet {'after' if quiet else 'NOT reached in'} {waited:.0f} s {busy}",
        ]
        lines += [f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in checks]
        report = "\n".join(lines)
        print(report)
        failed = [c.name for c in checks if not c.ok]
        assert set(served) >= set(cluster.nodes), f"nginx did not send customers to both nodes: {report}"
        assert placed_after > 0, f"no customer got an order placed on {survivor} after the kill\n{report}"
        assert quiet, f"the shop did not go quiet\n{report}\n{cluster.tail(chars=1500)}"
        assert not failed, f"{len(failed)} guarantees broke: {failed}\n{report}"
