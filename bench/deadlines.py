"""How late do per-order payment deadlines fire under load?

Places N real orders (place_order arms each deadline in its transaction and hands it to
rq-scheduler after the commit), then moves every order's last change back so its deadline falls
due inside a short span a few seconds ahead (direct rows + announce), while a real
`flask shop scheduler` and W real `flask shop worker` processes run; waits until every order is
cancelled and its stock restored, and prints the lateness percentiles:

  cancelled  = when the OrderCancelled event was committed - the order's due instant
  completed  = when the deadline command row was marked done - the due instant
  restored   = when the stock came back (the compensation's delivery done) - the due instant

Target: p99 of `cancelled` at most 1.5 s. That holds while deadlines arrive below what the workers
can run: the last lines print the worker CPU per deadline and the rate the cores could sustain at
that cost. Past it (100/s is past it on a 2-core machine) every deadline waits for
the backlog ahead of it, and lateness grows through the run instead of reflecting the
scheduler's one-second resolution. Run `--spread 20` (50/s) and `--spread 10` (100/s) to see both.

    python bench/deadlines.py [--orders 1000] [--spread 20] [--lead 5] [--workers 2] [--window 1800]
                              [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
                              [--redis-url redis://127.0.0.1:6379/10]

A fresh database is created on the PostgreSQL server (and dropped afterwards); a SQLite URL uses
a temporary file. Redis keys carry a per-run prefix.
"""

from __future__ import annotations

from scratchdb import make_database  # bench/scratchdb.py
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sqlalchemy import func, insert, select, update  # noqa: E402


def workers_cpu_seconds(procs) -> float:
    """User + system CPU of the given processes (Linux /proc), whatever else competes for the cores."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in procs:
        with open(f"/proc/{p.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def pct(values, p):
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1)))))
    return ordered[k]


def describe(name, values):
    if not values:
        return f"{name:<10} (none)"
    return (
        f"{name:<10} n={len(values):5d}  p50={statistics.median(values):6.3f}s  p90={pct(values, 90):6.3f}s  "
        f"p99={pct(values, 99):6.3f}s  max={max(values):6.3f}s  min={min(values):6.3f}s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--window", type=int, default=1800, help="payment window in seconds")
    parser.add_argument(
        "--spread",
        type=float,
        default=20.0,
        help="deadlines fall due evenly over this many seconds (default 20: 50/s for 1000)",
    )
    parser.add_argument("--lead", type=float, default=5.0, help="seconds from arming to the first deadline")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10"))
    args = parser.parse_args()

    database_url, drop = make_database(args.database_url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    env_settings = {
        "DATABASE_URL": database_url,
        "REDIS_URL": args.redis_url,
        "SECRET_KEY": "bench",
        "BACKSTOP_QUEUE_PREFIX": prefix,
        "UNPAID_ORDER_EXPIRY_SECONDS": str(args.window),
        "RECONCILIATION_STUCK_AGE_SECONDS": str(args.window),
        "RECONCILIATION_INTERVAL_SECONDS": "3600",
        "RECONCILIATION_ENABLED": "false",
        "SCHEDULER_POLL_SECONDS": "1",
        "STRIPE_API_BASE": "http://127.0.0.1:9",
        "STRIPE_WEBHOOK_SECRET": "whsec_x",
        "BACKSTOP_INSTANCE_PATH": tempfile.mkdtemp(prefix="backstop-bench-instance-"),
    }
    os.environ.update(env_settings)
    children: list[subprocess.Popen] = []
    logdir = tempfile.mkdtemp(prefix="backstop-bench-logs-")
    try:
        from flask_migrate import upgrade

        from shop import create_app
        from shop.extensions import db
        from shop.models import (
            Cart,
            CartItem,
            InventoryItem,
            OutboxDelivery,
            OutboxEvent,
            Product,
            ScheduledCommand,
            Variant,
        )
        from shop.orders.checkout import place_order

        app = create_app()
        with app.app_context():
            upgrade()
            product = Product(slug="bench", name="Bench", description="")
            db.session.add(product)
            db.session.flush()
            variant = Variant(product_id=product.id, sku="BENCH-1", name="one", price=100, currency="usd")
            db.session.add(variant)
            db.session.flush()
            db.session.add(InventoryItem(variant_id=variant.id, on_hand=10 * args.orders))
            db.session.commit()
            variant_id = variant.id

        flask = [os.path.join(os.path.dirname(sys.executable), "flask"), "--app", "app"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        def start(name, cmd):
            out = open(os.path.join(logdir, f"{name}.log"), "wb")
            children.append(
                subprocess.Popen(
                    flask + cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
            out.close()

        start("scheduler", ["shop", "scheduler"])
        for i in range(args.workers):
            start(f"worker{i}", ["shop", "worker"])

        with app.app_context():
            from rq import Worker

            from shop import queue

            t0 = time.monotonic()
            while len(Worker.all(queue=queue.work_queue())) < args.workers:
                if time.monotonic() - t0 > 30:
                    raise SystemExit("workers did not start")
                time.sleep(0.1)
            time.sleep(1.5)  # let the scheduler's start-up (periodic jobs, first sweep) settle

            # Arm: N real orders (place_order arms each deadline in its transaction, 30 min out),
            # then move every order's last change back so that its deadline falls inside the
            # measured span, and hand the moved rows to rq-scheduler again (direct rows + announce).
            print(f"placing {args.orders} orders...")
            started = time.monotonic()
            for i in range(args.orders):
                browser = f"bench-{i}"
                cart = Cart(browser_id=browser, status="open")
                db.session.add(cart)
                db.session.flush()
                db.session.execute(insert(CartItem).values(cart_id=cart.id, variant_id=variant_id, quantity=1))
                cart_id = cart.id
                db.session.commit()
                placed = place_order(cart_id=cart_id, browser_id=browser, email="bench@example.com")
                assert placed.ok, placed
            print(f"placed in {time.monotonic() - started:.1f}s")

            from shop.domain.deadlines import utcnow
            from shop.models import Order

            base = utcnow() + timedelta(seconds=args.lead)
            commands = db.session.execute(
                select(ScheduledCommand.id, ScheduledCommand.order_id)
                .where(ScheduledCommand.kind == "expire_unpaid_order")
                .order_by(ScheduledCommand.id)
            ).all()
            window = timedelta(seconds=args.window)
            armed = []
            for i, (command_id, order_id) in enumerate(commands):
                due = base + timedelta(seconds=args.spread * i / max(1, len(commands) - 1))
                db.session.execute(
                    update(Order)
                    .where(Order.id == order_id)
                    .values(created_at=due - window, updated_at=due - window)
                    .execution_options(synchronize_session=False)
                )
                db.session.execute(
                    update(ScheduledCommand)
                    .where(ScheduledCommand.id == command_id)
                    .values(next_attempt_at=due)
                    .execution_options(synchronize_session=False)
                )
                armed.append((command_id, due))
            db.session.commit()
            queue.announce([], armed)
            cpu_before = workers_cpu_seconds(children[1:])
            ahead = (base - utcnow()).total_seconds()
            print(
                f"armed {len(armed)} deadlines due over {args.spread}s starting in {ahead:.1f}s "
                f"({len(armed) / max(args.spread, 1e-9):.0f}/s), window {args.window}s, {args.workers} worker(s), "
                f"{'PostgreSQL' if database_url.startswith('postgres') else 'SQLite'}"
            )
            if ahead < 0:
                print("WARNING: arming took longer than --lead; the first deadlines were already due")

            deadline = time.monotonic() + args.lead + args.spread + 120
            while True:
                left = db.session.execute(
                    select(func.count()).select_from(Order).where(Order.status != "Cancelled")
                ).scalar_one()
                unrestored = db.session.execute(
                    select(func.count()).select_from(Order).where(Order.inventory_restored.is_(False))
                ).scalar_one()
                db.session.rollback()
                if left == 0 and unrestored == 0:
                    break
                if time.monotonic() > deadline:
                    print(f"gave up: {left} order(s) not cancelled, {unrestored} not restored")
                    break
                time.sleep(0.25)

            rows = db.session.execute(
                select(Order.id, Order.created_at, ScheduledCommand.completed_at, ScheduledCommand.attempts).join(
                    ScheduledCommand,
                    (ScheduledCommand.order_id == Order.id) & (ScheduledCommand.kind == "expire_unpaid_order"),
                )
            ).all()
            cancelled_at = dict(
                db.session.execute(
                    select(OutboxEvent.order_id, OutboxEvent.created_at).where(OutboxEvent.name == "OrderCancelled")
                ).all()
            )
            restored_at = dict(
                db.session.execute(
                    select(OutboxDelivery.order_id, OutboxDelivery.completed_at).where(
                        OutboxDelivery.handler == "restore_inventory", OutboxDelivery.status == "done"
                    )
                ).all()
            )
            reasons = (
                db.session.execute(select(OutboxEvent.payload).where(OutboxEvent.name == "OrderCancelled"))
                .scalars()
                .all()
            )
            db.session.rollback()

            def late(at, created):
                return (at - (created + window)).total_seconds()

            cancelled = [late(cancelled_at[oid], created) for oid, created, _c, _a in rows if oid in cancelled_at]
            completed = [late(done, created) for _oid, created, done, _a in rows if done is not None]
            restored = [late(restored_at[oid], created) for oid, created, _c, _a in rows if oid in restored_at]
            dues = [created + window for _oid, created, _c, _a in rows]
            early_runs = sum(1 for *_x, attempts in rows if attempts and attempts > 1)
            by_deadline = sum(1 for p in reasons if p.get("reason") == "payment window expired")
            print(
                f"due span {(max(dues) - min(dues)).total_seconds():.1f}s; cancelled {len(cancelled)}/{len(rows)} "
                f"({by_deadline} by their deadline, {len(reasons) - by_deadline} otherwise); "
                f"{early_runs} deadline(s) needed a retry"
            )
            print(describe("cancelled", cancelled))
            print(describe("completed", completed))
            print(describe("restored", restored))
            cpu = workers_cpu_seconds(children[1:]) - cpu_before
            jobs = sum(w.successful_job_count + w.failed_job_count for w in Worker.all(queue=queue.work_queue()))
            print(
                f"worker CPU {cpu * 1000 / max(len(rows), 1):.1f} ms per deadline (command + its restore delivery); "
                f"{jobs} RQ jobs in all ({jobs / max(len(rows), 1):.2f} per deadline)"
            )
            per = cpu / max(len(rows), 1)
            if per > 0:
                # An upper bound: PostgreSQL, Redis and the scheduler share the same cores.
                ceiling = (os.cpu_count() or 1) / per
                rate = len(rows) / max(args.spread, 0.001)
                print(
                    f"at that cost {os.cpu_count()} cores run at most ~{ceiling:.0f} deadlines/s; this run armed "
                    f"{rate:.0f}/s"
                    + (" (over capacity: lateness grows with the backlog)" if rate > ceiling * 0.7 else "")
                )
            if cancelled:
                verdict = "OK" if pct(cancelled, 99) <= 1.5 else "MISSED"
                print(f"target p99(cancelled) <= 1.5s: {verdict} ({pct(cancelled, 99):.3f}s)")
            db.session.remove()
            db.engine.dispose()
            # Leave Redis as we found it: our jobs and queues only.
            conn = queue.redis_conn()
            sched = queue.scheduler()
            for job in list(sched.get_jobs()):
                if job.id.startswith(prefix):
                    sched.cancel(job)
                    job.delete()
            for key in conn.scan_iter(f"rq:queue:{prefix}-*"):
                conn.delete(key)
        return 0
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


if __name__ == "__main__":
    sys.exit(main())
