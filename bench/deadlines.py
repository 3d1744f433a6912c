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

With `--sessions M` (default 0: none, and no provider at all) M more orders are sent to the
provider's hosted page first (PaymentInitiated): the bench starts the Stripe sandbox
(`flask shop stripe-sandbox --min-session-seconds S`, S = `--session-min-seconds`) as a
subprocess, points every process at it, and creates the M Checkout Sessions itself through
`start_payment` with the provider budgets lifted for its own app only (the budget's scripts take
each caller's limits, so the workers keep theirs: `STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND`, 20/s
by default). Every session gets the same expires_at, the instant the first sessionless deadline
falls due plus `--session-offset`. The sandbox expires them by itself, no webhook reaches the
shop, so their deadlines (due at expires_at + a 2 s grace) must learn from the provider that the
sessions expired before they cancel. Twenty or more due together read its event list once (a
page per 20 deadlines at most, shop.payments.expiry_reads) instead of one
`GET /v1/checkout/sessions/{id}` each; a session the read left open is still retrieved alone:

  cancelled  = when the OrderCancelled event was committed - the session's expires_at
  (completed and restored likewise), then the workers' provider calls from the sandbox's request
  log by endpoint, against the targets: at most one call per 20 session deadlines, and p99 of
  `cancelled` at most 3 s.

    python bench/deadlines.py [--orders 1000] [--spread 20] [--lead 5] [--workers 2] [--window 1800]
                              [--sessions 0] [--session-min-seconds 0] [--session-offset 0]
                              [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
                              [--redis-url redis://127.0.0.1:6379/10]

e.g. `python bench/deadlines.py --orders 300 --spread 5 --sessions 200`.

A fresh database is created on the PostgreSQL server (and dropped afterwards); a SQLite URL uses
a temporary file. Redis keys carry a per-run prefix. The sandbox, the scheduler and the workers are
stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import timedelta

from scratchdb import make_database, move_deadline, place_bench_order, seed_bench_variant  # bench/scratchdb.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sqlalchemy import func, select  # noqa: E402

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")


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


# The per-endpoint path the session deadlines ask (as the sandbox's request log names it).
READ_SESSION = "GET /v1/checkout/sessions/{id}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sandbox_get(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return json.loads(resp.read())


def wait_for_sandbox(base: str, proc) -> None:
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the sandbox exited with {proc.returncode}")
        try:
            sandbox_get(base, "/_sandbox/clock")
            return
        except OSError:
            if time.monotonic() - t0 > 30:
                raise SystemExit("the sandbox did not start") from None
            time.sleep(0.1)


def most_in_one_second(times) -> int:
    """The most calls that arrived within any one second (a sliding window)."""
    ordered, best, lo = sorted(times), 0, 0
    for hi, at in enumerate(ordered):
        while ordered[lo] <= at - 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


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
    parser.add_argument("--timeline", action="store_true", help="print lateness by when each deadline fell due")
    parser.add_argument(
        "--sessions",
        type=int,
        default=0,
        help="orders at the provider's hosted page too, their sessions all expiring at one instant (default 0)",
    )
    parser.add_argument(
        "--session-min-seconds",
        type=int,
        default=0,
        help="the sandbox's --min-session-seconds and STRIPE_SESSION_MIN_SECONDS (default 0)",
    )
    parser.add_argument(
        "--session-offset",
        type=float,
        default=0.0,
        help="the sessions' expires_at, in seconds after the first sessionless deadline (default 0)",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10"))
    args = parser.parse_args()
    if args.sessions < 0 or args.session_offset < 0:
        parser.error("--sessions and --session-offset must not be negative")

    database_url, drop = make_database(args.database_url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    sandbox_base = f"http://127.0.0.1:{free_port()}" if args.sessions else None
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
        # Without sessions nothing may reach a provider: nothing listens on port 9.
        "STRIPE_API_BASE": sandbox_base or "http://127.0.0.1:9",
        "STRIPE_SESSION_MIN_SECONDS": str(args.session_min_seconds),
        "STRIPE_WEBHOOK_SECRET": "whsec_x",
        "BACKSTOP_INSTANCE_PATH": tempfile.mkdtemp(prefix="backstop-bench-instance-"),
    }
    os.environ.update(env_settings)
    # The bench's own app creates the sessions with the budgets lifted: the budget's scripts take
    # the limits from each caller (ARGV), so the workers' processes keep theirs.
    bench_env = {
        **os.environ,
        "STRIPE_RATE_LIMIT_PER_SECOND": "10000",
        "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND": "10000",
    }
    children: list[subprocess.Popen] = []
    workers: list[subprocess.Popen] = []
    logdir = tempfile.mkdtemp(prefix="backstop-bench-logs-")
    try:
        from flask_migrate import upgrade

        from shop import create_app
        from shop.extensions import db
        from shop.models import (
            OutboxDelivery,
            OutboxEvent,
            ScheduledCommand,
        )

        app = create_app(env=bench_env)
        total_orders = args.orders + args.sessions
        with app.app_context():
            upgrade()
            variant_id = seed_bench_variant(10 * total_orders)

        flask = [os.path.join(os.path.dirname(sys.executable), "flask"), "--app", "app"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        def start(name, cmd):
            out = open(os.path.join(logdir, f"{name}.log"), "wb")
            proc = subprocess.Popen(
                flask + cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            children.append(proc)
            out.close()
            return proc

        if sandbox_base:
            port = sandbox_base.rsplit(":", 1)[1]
            sandbox = start(
                "sandbox",
                ["shop", "stripe-sandbox", "--port", port, "--min-session-seconds", str(args.session_min_seconds)],
            )
            wait_for_sandbox(sandbox_base, sandbox)
        start("scheduler", ["shop", "scheduler"])
        for i in range(args.workers):
            workers.append(start(f"worker{i}", ["shop", "worker"]))

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
            # The M session orders are placed first (the lowest ids).
            print(f"placing {total_orders} orders...")
            started = time.monotonic()
            for i in range(total_orders):
                place_bench_order(variant_id, f"bench-{i}")
            print(f"placed in {time.monotonic() - started:.1f}s")

            from shop.domain.deadlines import SESSION_SLACK_SECONDS, utcnow
            from shop.models import Order
            from shop.payments.start import StartStatus, start_payment

            commands = db.session.execute(
                select(ScheduledCommand.id, ScheduledCommand.order_id)
                .where(ScheduledCommand.kind == "expire_unpaid_order")
                .order_by(ScheduledCommand.id)
            ).all()
            session_commands, commands = commands[: args.sessions], commands[args.sessions :]
            window = timedelta(seconds=args.window)
            base = utcnow() + timedelta(seconds=args.lead)
            session_orders: set[int] = set()
            if session_commands:
                # The provider refuses a session shorter than its minimum (the shop asks for
                # SESSION_SLACK_SECONDS more): the common expires_at leaves room for creating
                # all M at a pessimistic 50/s.
                earliest = args.session_min_seconds + SESSION_SLACK_SECONDS + 2 + args.sessions / 50
                expires = max(base + timedelta(seconds=args.session_offset), utcnow() + timedelta(seconds=earliest))
                base = expires - timedelta(seconds=args.session_offset)
                # pay_by = the order's last change + the window = expires: the session lives until
                # then (session_expires_at), and the order's deadline row, left where place_order
                # armed it, fires there (and waits out the grace, as in production).
                session_orders = {order_id for _c, order_id in session_commands}
                for command_id, order_id in session_commands:
                    move_deadline(order_id, command_id, expires, window)
                db.session.commit()
                queue.announce([], [(command_id, expires) for command_id, _o in session_commands])
                started = time.monotonic()
                for _command_id, order_id in session_commands:
                    # A session made for an order without one lives a whole window from its
                    # making (domain.deadlines.session_pay_by): made "at" expires - window, every
                    # one of them expires at the same instant.
                    outcome = start_payment(order_id, now=expires - window)
                    assert outcome.status is StartStatus.STARTED, outcome
                db.session.rollback()
                spent = time.monotonic() - started
                span = db.session.execute(
                    select(
                        func.min(Order.payment_session_expires_at), func.max(Order.payment_session_expires_at)
                    ).where(Order.id.in_(session_orders))
                ).one()
                db.session.rollback()
                print(
                    f"created {len(session_commands)} checkout sessions in {spent:.1f}s "
                    f"({len(session_commands) / max(spent, 1e-9):.0f}/s, budgets lifted for the bench only); "
                    f"they expire over {(span[1] - span[0]).total_seconds():.1f}s starting in "
                    f"{(span[0] - utcnow()).total_seconds():.1f}s"
                )

            armed = []
            for i, (command_id, order_id) in enumerate(commands):
                due = base + timedelta(seconds=args.spread * i / max(1, len(commands) - 1))
                move_deadline(order_id, command_id, due, window)
                armed.append((command_id, due))
            db.session.commit()
            queue.announce([], armed)
            cpu_before = workers_cpu_seconds(workers)
            calls_since = time.time()  # the workers' provider calls from here on (the bench made its own before)
            ahead = (base - utcnow()).total_seconds()
            print(
                f"armed {len(armed)} deadlines due over {args.spread}s starting in {ahead:.1f}s "
                f"({len(armed) / max(args.spread, 1e-9):.0f}/s), window {args.window}s, {args.workers} worker(s), "
                f"{'PostgreSQL' if database_url.startswith('postgres') else 'SQLite'}"
            )
            if ahead < 0:
                print("WARNING: arming took longer than --lead; the first deadlines were already due")

            deadline = (
                time.monotonic() + max(ahead, 0) + args.spread + args.session_offset + 120 + 2 * args.sessions / 10
            )
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
                select(
                    Order.id,
                    Order.created_at,
                    ScheduledCommand.completed_at,
                    ScheduledCommand.attempts,
                    Order.payment_session_expires_at,
                ).join(
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
            reasons = dict(
                db.session.execute(
                    select(OutboxEvent.order_id, OutboxEvent.payload).where(OutboxEvent.name == "OrderCancelled")
                ).all()
            )
            db.session.rollback()

            def report(label, group, due_of):
                """The lateness of one group of orders, each measured from `due_of(row)`."""

                def late(at, row):
                    return (at - due_of(row)).total_seconds()

                cancelled = [late(cancelled_at[r.id], r) for r in group if r.id in cancelled_at]
                completed = [late(r.completed_at, r) for r in group if r.completed_at is not None]
                restored = [late(restored_at[r.id], r) for r in group if r.id in restored_at]
                dues = [due_of(r) for r in group]
                retried = sum(1 for r in group if r.attempts and r.attempts > 1)
                why = [reasons[r.id].get("reason") for r in group if r.id in reasons]
                by_deadline = sum(1 for reason in why if reason == "payment window expired")
                print(
                    f"{label}: due span {(max(dues) - min(dues)).total_seconds():.1f}s; cancelled "
                    f"{len(cancelled)}/{len(group)} ({by_deadline} as 'payment window expired', "
                    f"{len(why) - by_deadline} otherwise); {retried} deadline(s) ran more than once"
                )
                print(describe("cancelled", cancelled))
                print(describe("completed", completed))
                print(describe("restored", restored))
                if args.timeline and dues:
                    # Lateness by when the deadline fell due, in half seconds from the first: where
                    # in the burst the late ones were (a drain's budget, a poll, the backlog).
                    first = min(dues)
                    buckets: dict[int, list[float]] = {}
                    for r in group:
                        if r.id in cancelled_at:
                            key = int((due_of(r) - first).total_seconds() * 2)
                            buckets.setdefault(key, []).append(late(cancelled_at[r.id], r))
                    print(
                        "  by due time: "
                        + "  ".join(
                            f"+{k / 2:.1f}s:{statistics.median(v):.2f}/{max(v):.2f}" for k, v in sorted(buckets.items())
                        )
                        + "  (median/max cancelled lateness, s)"
                    )
                return cancelled

            plain = [r for r in rows if r.id not in session_orders]
            paying = [r for r in rows if r.id in session_orders]
            cancelled = report("without a session", plain, lambda r: r.created_at + window) if plain else []
            if paying:
                session_cancelled = report(
                    "at the provider (lateness from the session's expires_at)",
                    paying,
                    lambda r: r.payment_session_expires_at,
                )
            cpu = workers_cpu_seconds(workers) - cpu_before
            jobs = sum(w.successful_job_count + w.failed_job_count for w in Worker.all(queue=queue.work_queue()))
            print(
                f"worker CPU {cpu * 1000 / max(len(rows), 1):.1f} ms per deadline (command + its restore delivery"
                f"{', both kinds' if paying else ''}); {jobs} RQ jobs in all "
                f"({jobs / max(len(rows), 1):.2f} per deadline)"
            )
            per = cpu / max(len(rows), 1)
            if per > 0:
                # An upper bound: PostgreSQL, Redis and the scheduler share the same cores.
                ceiling = (os.cpu_count() or 1) / per
                rate = len(plain) / max(args.spread, 0.001)
                print(
                    f"at that cost {os.cpu_count()} cores run at most ~{ceiling:.0f} deadlines/s; this run armed "
                    f"{rate:.0f}/s"
                    + (f" and {len(paying)} session deadlines at one instant" if paying else "")
                    + (" (over capacity: lateness grows with the backlog)" if rate > ceiling * 0.7 else "")
                )
            if cancelled:
                verdict = "OK" if pct(cancelled, 99) <= 1.5 else "MISSED"
                print(f"target p99(cancelled) <= 1.5s without a session: {verdict} ({pct(cancelled, 99):.3f}s)")
            if paying:
                calls = sandbox_get(sandbox_base, f"/_sandbox/requests?since={calls_since}")["calls"]
                reads = [c["at"] for c in calls if c["endpoint"] == READ_SESSION]
                others = {}
                for c in calls:
                    if c["endpoint"] != READ_SESSION:
                        others[c["endpoint"]] = others.get(c["endpoint"], 0) + 1
                refused = sum(1 for c in calls if c["status"] != 200)
                spread = (max(reads) - min(reads)) if len(reads) > 1 else 0.0
                print(
                    f"workers' provider calls: {len(reads)} x {READ_SESSION} over {spread:.1f}s "
                    f"({(len(reads) - 1) / spread if spread else 0:.1f}/s, at most {most_in_one_second(reads)} "
                    f"in any one second); other endpoints {others or 'none'}; {refused} not answered 200"
                )
                # The sandbox's count includes the provider watch's periodic one-event reads; the
                # calls the workers' use cases made are the ones their logs name ("provider call").
                made = 0
                for i in range(args.workers):
                    with open(os.path.join(logdir, f"worker{i}.log"), encoding="utf-8", errors="replace") as fh:
                        made += fh.read().count("provider call ")
                allowed = max(1, -(-len(paying) // 20))
                late99 = pct(session_cancelled, 99) if session_cancelled else float("nan")
                verdict = "OK" if made <= allowed and late99 <= 3.0 else "MISSED"
                print(
                    f"target for {len(paying)} session deadlines: at most {allowed} provider call(s) by the workers, "
                    f"p99(cancelled) <= 3s: {verdict} ({made} call(s), p99 {late99:.3f}s)"
                )
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
        # Workers and the scheduler first, the sandbox (started first) last.
        for proc in reversed(children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(children):
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
