"""How long is the sweep out of service when the process holding its lease dies mid-cycle?

Starts two "nodes" at production intervals (the default 20 s sweep lease, SCHEDULER_POLL_SECONDS
1, RECONCILIATION_INTERVAL_SECONDS 600), each a real `flask shop scheduler` and `flask shop
worker` under a host name of its own (`unshare --uts`, as root), on one database and one Redis.
Each run places stuck orders, starts a `flask shop sweep` under a third host name whose every
order takes --order-seconds (a failpoint), waits until it is mid-cycle, waits a random part of a
heartbeat so the kill lands anywhere between two renewals, SIGKILLs it, and times how long until
another process starts a cycle (its row in `reconciliation_cycles`). Since the holder is on
"another machine", no survivor can look its pid up: the lease has to lapse, and a scheduler's
poll queues the cycle that takes it over. Prints every run, then the median and the max, against
the 30 s the shop promises.

    python bench/takeover.py [--runs 5] [--orders 12] [--order-seconds 1]
                             [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
                             [--redis-url redis://127.0.0.1:6379/10] [--same-host]

--same-host runs everything under this machine's name: the pid check then takes the lease over
at the next poll. A fresh database is created on the PostgreSQL server (and dropped afterwards);
a SQLite URL uses a temporary file. Redis keys carry a per-run prefix.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta

from scratchdb import make_database, place_bench_order, seed_bench_variant  # bench/scratchdb.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sqlalchemy import func, select, update  # noqa: E402

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--orders", type=int, default=12, help="stuck orders per run (one cycle's worth)")
    parser.add_argument("--order-seconds", type=float, default=1.0, help="how long each of the holder's orders takes")
    parser.add_argument("--same-host", action="store_true", help="no host names of their own: the pid fast path")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10"))
    args = parser.parse_args()
    if not args.same_host and (os.geteuid() != 0 or not shutil.which("unshare")):
        raise SystemExit("bench/takeover.py needs root and unshare(1) for host names of their own (or --same-host)")

    database_url, drop = make_database(args.database_url, "takeover")
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    window = 1800
    os.environ.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": args.redis_url,
            "SECRET_KEY": "bench",
            "BACKSTOP_QUEUE_PREFIX": prefix,
            "UNPAID_ORDER_EXPIRY_SECONDS": str(window),
            "RECONCILIATION_STUCK_AGE_SECONDS": str(window),
            "RECONCILIATION_INTERVAL_SECONDS": "600",
            "RECONCILIATION_ENABLED": "false",  # the expiry pass alone: no provider needed
            "SCHEDULER_POLL_SECONDS": "1",
            "STRIPE_API_BASE": "http://127.0.0.1:9",
            "STRIPE_WEBHOOK_SECRET": "whsec_x",
            "BACKSTOP_INSTANCE_PATH": tempfile.mkdtemp(prefix="backstop-bench-instance-"),
        }
    )
    os.environ.pop("BACKSTOP_RECONCILIATION_LEASE_SECONDS", None)  # the production default
    children: list[subprocess.Popen] = []
    logdir = tempfile.mkdtemp(prefix="backstop-bench-logs-")
    flask = [os.path.join(os.path.dirname(sys.executable), "flask"), "--app", "app"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def command(host: str, cmd: list[str]) -> list[str]:
        if args.same_host:
            return flask + cmd
        return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host] + flask + cmd

    def start(name: str, host: str, cmd: list[str], extra_env: dict | None = None) -> subprocess.Popen:
        out = open(os.path.join(logdir, f"{name}.log"), "ab")
        proc = subprocess.Popen(
            command(host, cmd),
            cwd=ROOT,
            env={**env, **(extra_env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        children.append(proc)
        return proc

    try:
        from flask_migrate import upgrade

        from shop import create_app
        from shop.domain.deadlines import utcnow
        from shop.extensions import db
        from shop.models import Lease, Order, ReconciliationCycle
        from shop.scheduling.lease import BEATS_PER_LEASE, DEFAULT_LEASE_SECONDS, LEASE_NAME

        app = create_app()
        with app.app_context():
            upgrade()
            variant_id = seed_bench_variant(10 * args.orders * args.runs)

        for node in ("a", "b"):
            start(f"scheduler-{node}", f"node-{node}", ["shop", "scheduler"])
            start(f"worker-{node}", f"node-{node}", ["shop", "worker"])

        def one(statement):
            value = db.session.execute(statement).scalar()
            db.session.rollback()
            return value

        def latest_cycle():
            c = ReconciliationCycle
            row = db.session.execute(select(c.id, c.status, c.holder).order_by(c.id.desc()).limit(1)).first()
            db.session.rollback()
            return row

        def wait(check, timeout: float, what: str):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                result = check()
                if result:
                    return result
                time.sleep(0.05)
            raise SystemExit(f"timed out waiting for {what} (logs in {logdir})")

        def cancelled(ids) -> int:
            return one(select(func.count()).where(Order.id.in_(ids), Order.status == "Cancelled"))

        with app.app_context():
            from rq import Worker

            from shop import queue

            wait(lambda: len(Worker.all(queue=queue.work_queue())) >= 2, 30, "the workers")
            # The schedulers' first cycle runs at their start; the next one is 10 minutes away.
            wait(lambda: (row := latest_cycle()) is not None and row.status == "ok", 60, "the start-up cycle")
            lease = DEFAULT_LEASE_SECONDS
            print(
                f"sweep lease {lease} s (renewed every {lease / BEATS_PER_LEASE:g} s), scheduler poll 1 s, "
                f"interval 600 s; holder on {'this machine' if args.same_host else 'another machine'}; "
                f"{args.runs} runs, {args.orders} orders of {args.order_seconds:g} s each"
            )
            took = []
            for run in range(1, args.runs + 1):
                ids = []
                for i in range(args.orders):
                    ids.append(place_bench_order(variant_id, f"bench-{run}-{i}"))
                db.session.execute(
                    update(Order).where(Order.id.in_(ids)).values(updated_at=utcnow() - timedelta(hours=2))
                )
                db.session.commit()

                holder_proc = start(
                    f"holder-{run}",
                    "node-c",
                    ["shop", "sweep"],
                    {"BACKSTOP_FAILPOINTS": f"sweep.after_order=sleep:{args.order_seconds}"},
                )
                wait(lambda ids=ids: cancelled(ids) >= 2, 60, "the holder's cycle")
                holder = one(select(Lease.holder).where(Lease.name == LEASE_NAME))
                its_cycle = latest_cycle().id
                # Anywhere between two renewals, and past the first few orders.
                time.sleep(random.uniform(0, lease / BEATS_PER_LEASE))
                os.kill(holder_proc.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                holder_proc.wait()
                row = wait(
                    lambda its_cycle=its_cycle: (
                        (r := latest_cycle()) is not None and r.id > its_cycle and r.status != "skipped" and r
                    ),
                    120,
                    "another cycle",
                )
                seconds = time.monotonic() - killed_at
                took.append(seconds)
                print(f"run {run}: killed {holder} mid-cycle; {row.holder} started a cycle {seconds:.2f} s later")
                wait(lambda ids=ids: cancelled(ids) == len(ids), 120, "the rest of the orders")
                wait(
                    lambda: one(select(func.count()).select_from(Lease).where(Lease.name == LEASE_NAME)) == 0,
                    60,
                    "the cycle's end",
                )
            print(
                f"takeover after SIGKILL: median {statistics.median(took):.2f} s, max {max(took):.2f} s, "
                f"min {min(took):.2f} s over {len(took)} runs (promised: within 30 s)"
            )
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.environ.get("BENCH_KEEP_LOGS"):
            print(f"process logs in {logdir}")
        drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
