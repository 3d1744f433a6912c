"""What the shop's own processes spend on one customer's journey, and where. Prints figures,
asserts nothing.

    python bench/journey_cpu.py [--seconds 20] [--customers 8] [--no-profile] [--only paid|cancelled]
                                [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

One node (tests/cluster_support.py: the Procfile's web under gunicorn, one `flask shop worker`,
`flask shop scheduler`, behind nginx, the Stripe sandbox as the provider with its budgets lifted)
serves closed-loop customers over HTTP, a new browser for each journey, first customers who pay
(cart, checkout, the hosted page, the return page; the webhook, the paid email), then customers
who cancel (the same up to the hosted page, then the cancel; the expiry at the provider, the
restore, the email).

For each phase: the CPU (utime + stime from /proc, every process of each group: gunicorn's
workers are in the web's) of the web, the worker and the scheduler per finished journey (the
orders' OrderPaid or OrderCancelled events in the window), and their sum, the shop's CPU per
journey. Not counted: the sandbox (the provider's side), nginx, PostgreSQL and the customers
(this process), which a real shop does not run or runs elsewhere; PostgreSQL's backends are
printed beside for reference. Target: at most 40 ms of shop CPU per paid journey.

With py-spy on PATH (PyPI's `py-spy`; root, as here), each shop process is sampled during the
phase (only threads holding the GIL: Python's CPU, not its waits) and the functions with the
most samples of their own (self time), and the shop's own
functions with the most samples beneath them (inclusive), are printed: where to cut.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


from cluster_support import Cluster, Customers, why_no_cluster  # noqa: E402

# The simulated customers place many unpaid orders from few browsers: lift the hoarding limits
# (docs/REFERENCE.md, Settings) for this process and the shop processes it starts.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
STOCK = {"NB-A5-DOT": 100_000, "NB-A6-DOT": 100_000, "MUG-350-SND": 100_000, "SOCK-M": 100_000}
BUDGETS = {"STRIPE_RATE_LIMIT_PER_SECOND": "10000", "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND": "10000"}
PHASES = (("paid", {"pay": 1}, "OrderPaid"), ("cancelled", {"cancel": 1}, "OrderCancelled"))
TARGET_PAID_MS = 40.0


def shop_cpu(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of the node's processes by role (web, worker, scheduler), and of the
    PostgreSQL backends serving the cluster's database."""
    found: dict[str, float] = collections.defaultdict(float)
    for proc in cluster.procs:
        if proc.node is not None and proc.alive:
            role = proc.name.split("/", 1)[1].rstrip("0123456789")
            found[role] += sum(proc.cpu().values())
    found["postgres (backends)"] = cluster.backends_cpu()
    return found


def start_sampling(
    cluster: Cluster, seconds: float, folder: str, label: str
) -> list[tuple[str, subprocess.Popen, str]]:
    """py-spy on each shop process group's leader (with its children: gunicorn's workers), into a
    file of the phase's own (kept after the run: the folder is printed at the end)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        return []
    started = []
    for proc in cluster.procs:
        if proc.node is None or not proc.alive:
            continue
        out = os.path.join(folder, f"{label}-{proc.name.replace('/', '-')}.txt")
        argv = [spy, "record", "--pid", str(proc.popen.pid), "--subprocesses", "--format", "raw", "--gil"]
        argv += ["--nonblocking", "--duration", str(int(seconds)), "--rate", "200", "--output", out]
        started.append((proc.name, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out))
    return started


def summarize(samples: list[tuple[str, subprocess.Popen, str]], top: int) -> None:
    """The functions with most samples of their own, and the shop's own with most beneath them."""
    for name, spy, out in samples:
        spy.wait(timeout=120)
        if not os.path.exists(out):
            print(f"  {name}: no samples (py-spy: exit {spy.returncode})")
            continue
        own: collections.Counter = collections.Counter()
        beneath: collections.Counter = collections.Counter()
        total = 0
        with open(out, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
                if not frames:
                    continue
                n = int(count)
                total += n
                own[_short(frames[-1])] += n
                for frame in {_short(f) for f in frames if " (shop/" in f and "stripe_sandbox" not in f}:
                    beneath[frame] += n
        print(f"  {name}: {total} samples")
        for frame, n in own.most_common(top):
            print(f"    self {100 * n / max(total, 1):5.1f}%  {frame}")
        for frame, n in beneath.most_common(top):
            print(f"    shop {100 * n / max(total, 1):5.1f}%  {frame}")


def _short(frame: str) -> str:
    """`func (path/to/file.py:12)` as `func (file.py)`, enough to find it, one per function."""
    func, _, where = frame.partition(" (")
    path = where.split(":", 1)[0]
    return f"{func} ({path if path.startswith('shop/') else os.path.basename(path)})"


def phase(cluster: Cluster, args, label: str, mix: dict, event: str, folder: str) -> float:
    customers = Customers(cluster, args.customers, mix=mix, seed=7, one_journey_each=True)
    customers.start()
    try:
        time.sleep(3)  # warm-up: pools filled, first imports done
        samples = [] if args.no_profile else start_sampling(cluster, args.seconds, folder, label)
        before, t0 = shop_cpu(cluster), time.time()
        time.sleep(args.seconds)
        after, t1 = shop_cpu(cluster), time.time()
    finally:
        customers.stop()
    done = cluster.events_between(event, t0, t1)
    rate = done / args.seconds
    print(
        f"\n{label}: {args.customers} customers for {args.seconds:.0f} s: {done} journeys ({rate:.1f}/s), "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    shop = 0.0
    for role in sorted(after):
        used = after[role] - before.get(role, 0.0)
        if not role.startswith("postgres"):
            shop += used
        share = 100 * used / args.seconds
        print(f"  {role:<20} {1000 * used / max(done, 1):7.1f} ms per journey ({share:.0f}% of a core)")
    per = 1000 * shop / max(done, 1)
    print(f"  {'shop (web+worker+scheduler)':<20} {per:7.1f} ms per journey")
    if customers.notes:
        print(f"  customers saw: {dict(customers.notes)}")
    summarize(samples, args.top)
    return per


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20, help="seconds of measured load per phase")
    p.add_argument("--customers", type=int, default=8, help="closed-loop customers")
    p.add_argument("--top", type=int, default=12, help="functions listed per process")
    p.add_argument("--no-profile", action="store_true", help="do not sample with py-spy")
    p.add_argument("--only", choices=[label for label, _, _ in PHASES], help="run this phase alone")
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    )
    args = p.parse_args(argv)
    reason = why_no_cluster()
    if reason:
        print(f"journey_cpu: cannot start a node here: {reason}", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="backstop-journey-cpu-")
    figures = {}
    with Cluster(("node-a",), server_url=args.database_url, env=BUDGETS, label="journey") as cluster:
        cluster.set_stock(STOCK)
        for label, mix, event in PHASES:
            if args.only in (None, label):
                figures[label] = phase(cluster, args, label, mix, event, folder)
    said = [f"per {label} journey {per:.1f} ms" for label, per in figures.items()]
    if "paid" in figures:
        said[0] += f" (target {TARGET_PAID_MS:.0f} ms: {'OK' if figures['paid'] <= TARGET_PAID_MS else 'MISSED'})"
    print(
        f"\nshop CPU {', '.join(said)}; {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.1f}; raw profiles in {folder}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
