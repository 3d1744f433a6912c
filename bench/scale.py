"""One node, then two, under a checkout load; then one of the two dies. Prints figures, asserts
nothing.

    python bench/scale.py [--seconds 20] [--customers 12] [--window 20] [--after-kill 20]
                          [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres] [--keep]

Each node is the Procfile's web (gunicorn), one `flask shop worker` and `flask shop scheduler`, in
a UTS namespace of its own (its own host name), all on one fresh PostgreSQL database and one
throwaway Redis, behind nginx, with the Stripe sandbox as the provider and the provider budgets
(STRIPE_RATE_LIMIT_PER_SECOND, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND) lifted out of the way
(tests/cluster_support.py builds it; tests/processes/test_two_nodes.py is the test). Needs root
(unshare --uts) and nginx.

  capacity  --customers closed-loop customers (threads of this process) check out through nginx
            and pay at the sandbox for --seconds, on one node and then on two: orders paid per
            second, and each process's CPU per paid order (utime + stime from /proc/<pid>/stat
            of every process in its group, before and after; PostgreSQL's backends of the
            cluster's database too), and this process's own CPU (the
            customers: on a small machine they compete with the nodes for the same cores).
  kill      on the two nodes, customers pay, abandon, cancel and pay late (the test's mix); once
            --seconds have passed, the node whose scheduler last moved due jobs is SIGKILLed (every
            process of it) at the first moment it holds work in the database while the provider
            answers slowly (0.5 s), and customers go on for --after-kill seconds. After quiet:
            the time from the kill to each piece of work it had claimed being finished by the
            survivor, to the sweep's next successful cycle, to the first order expired by a
            deadline due after the kill, and how late those deadlines were; and what customers
            saw at nginx (502s, the first order placed after the kill).

Everything started is stopped and the database dropped at the end (logs kept with --keep).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


from cluster_support import (  # noqa: E402
    JOURNEYS,
    Cluster,
    Customers,
    kill_when_busy,
    measure_takeover,
    takeover_checks,
    wait_for_quiet,
    why_no_cluster,
)

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

STOCK = {"NB-A5-DOT": 100_000, "NB-A6-DOT": 100_000, "MUG-350-SND": 100_000, "SOCK-M": 100_000}
BUDGETS = {"STRIPE_RATE_LIMIT_PER_SECOND": "10000", "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND": "10000"}


def group_cpu(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of every live process group of the cluster, by name, and of the
    PostgreSQL backends serving the cluster's database (those alive now)."""
    found = {p.name: sum(p.cpu().values()) for p in cluster.procs if p.alive}
    found["postgres (backends)"] = cluster.backends_cpu()
    return found


def capacity(cluster: Cluster, customers_count: int, seconds: float, label: str) -> dict:
    customers = Customers(cluster, customers_count, mix={"pay": 1}, seed=1)
    customers.start()
    time.sleep(3)  # warm-up: pools filled, first imports done
    before, me_before, t0 = group_cpu(cluster), os.times(), time.time()
    time.sleep(seconds)
    after, me_after, t1 = group_cpu(cluster), os.times(), time.time()
    customers.stop()
    paid = cluster.events_between("OrderPaid", t0, t1)
    placed = cluster.events_between("OrderPlaced", t0, t1)
    per_node = cluster.requests_per_node(t0, t1)
    print(f"\n{label}: {customers_count} customers for {seconds:.0f} s")
    print(f"  orders placed {placed} ({placed / seconds:.1f}/s), paid {paid} ({paid / seconds:.1f}/s)")
    print(f"  requests per node at nginx: {dict(per_node)}")
    print("  CPU per paid order (ms), by process:")
    total = 0.0
    for name in sorted(after):
        used = after[name] - before.get(name, 0.0)
        if name.split("/")[0] in cluster.nodes or name.startswith("postgres"):
            total += used
        print(
            f"    {name:<20} {1000 * used / max(paid, 1):7.1f}   "
            f"({used:.1f} s of CPU, {100 * used / seconds:.0f}% of a core)"
        )
    mine = (me_after.user + me_after.system) - (me_before.user + me_before.system)
    print(f"    {'nodes + postgres':<20} {1000 * total / max(paid, 1):7.1f}")
    print(f"    {'customers (bench)':<20} {1000 * mine / max(paid, 1):7.1f}   ({100 * mine / seconds:.0f}% of a core)")
    if customers.notes:
        print(f"  customers saw: {dict(customers.notes)}")
    return {"paid_per_second": paid / seconds, "cpu_ms_per_order": 1000 * total / max(paid, 1)}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def kill_scenario(cluster: Cluster, args) -> None:
    customers = Customers(cluster, args.customers, mix=JOURNEYS, seed=2)
    customers.start()
    try:
        time.sleep(args.seconds)
        victim = cluster.scheduler_lock_node() or "node-a"
        cluster.sandbox("POST", "/_sandbox/faults", {"api_latency_seconds": 0.5})
        try:
            killed_at, orphaned, moment = kill_when_busy(cluster, victim, within=10)
        finally:
            cluster.sandbox("POST", "/_sandbox/faults", {"api_latency_seconds": 0})
        time.sleep(args.after_kill)
    finally:
        customers.stop()
    k = killed_at.timestamp()
    quiet, waited, busy = wait_for_quiet(cluster.sql, 150)
    t = measure_takeover(cluster, customers, killed_at, orphaned)
    print(
        f"\nkill: {victim} SIGKILLed {moment}; held at death: "
        + ", ".join(f"{len(v)} {n}" for n, v in orphaned.items())
    )
    print(f"  quiet {'after' if quiet else 'NOT reached in'} {waited:.0f} s after the load {busy}")
    for table, row_id, what, after in t.orphaned:
        print(f"  claimed {table} {row_id} ({what}): finished {_s(after)} after the kill")
    print(
        f"  sweep: next successful cycle finished {_s(t.sweep_again)} after the kill; "
        f"skipped before it: {t.sweep_skips}"
    )
    late = [s for _, s in t.deadline_lateness]
    print(
        f"  deadlines due after the kill: {len(late)}; first expired {_s(t.first_deadline_after_kill)} after the kill; "
        f"lateness p50 {pct(late, 0.5):.1f} s, p99 {pct(late, 0.99):.1f} s, max {max(late, default=float('nan')):.1f} s"
    )
    after_kill = sorted(j.placed_at for j in customers.journeys if j.placed_at and j.placed_at > k)
    print(f"  first order placed after the kill: {_s(after_kill[0] - k if after_kill else None)} after it")
    statuses = collections.Counter()
    with open(os.path.join(cluster.workdir, "nginx", "access.log")) as log:
        for line in log:
            at, status, *_ = line.split()
            if k <= float(at) <= k + 30:
                statuses[status] += 1
    print(f"  nginx answers in the 30 s after the kill: {dict(statuses)}")
    for c in takeover_checks(t):
        print(f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f} s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20, help="seconds of measured load per phase")
    p.add_argument("--customers", type=int, default=24, help="closed-loop customers (enough to keep the nodes busy)")
    p.add_argument("--window", type=int, default=20, help="the payment window (= stuck age)")
    p.add_argument("--after-kill", type=float, default=20)
    p.add_argument("--web-concurrency", type=int, default=2)
    p.add_argument("--web-threads", type=int, default=16)
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    )
    p.add_argument("--keep", action="store_true", help="keep the logs")
    args = p.parse_args(argv)
    reason = why_no_cluster()
    if reason:
        print(f"scale: cannot start nodes here: {reason}", file=sys.stderr)
        return 2
    print(f"scale: {os.cpu_count()} CPUs; nodes of web {args.web_concurrency}x{args.web_threads} + worker + scheduler")
    figures = {}
    for nodes in (("node-a",), ("node-a", "node-b")):
        with Cluster(
            nodes,
            window=args.window,
            web_concurrency=args.web_concurrency,
            web_threads=args.web_threads,
            server_url=args.database_url,
            env=BUDGETS,
            label="scale",
            keep_logs=args.keep,
        ) as cluster:
            cluster.set_stock(STOCK)
            figures[len(nodes)] = capacity(cluster, args.customers, args.seconds, f"{len(nodes)} node(s)")
            if len(nodes) == 2:
                kill_scenario(cluster, args)
            if args.keep:
                print(f"  logs in {cluster.workdir}")
    one, two = figures[1]["paid_per_second"], figures[2]["paid_per_second"]
    print(f"\ncapacity: one node {one:.1f} orders/s, two nodes {two:.1f} orders/s ({two / max(one, 1e-9):.2f}x)")
    print(
        f"CPU per paid order, the nodes and PostgreSQL together: "
        f"{figures[1]['cpu_ms_per_order']:.0f} ms with one node, "
        f"{figures[2]['cpu_ms_per_order']:.0f} ms with two"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
