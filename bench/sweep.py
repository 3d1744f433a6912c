"""Does one reconciliation cycle cost the batch or the table?

Fills `orders` to 10k, 100k and 1M rows (bulk INSERT ... SELECT generate_series) with the same
number of stuck orders at every size, times one full cycle (expiry pass + provider pass, the
provider answering 503 so the provider pass is its query plus a few refused calls) several
times per size, and prints the medians, the 1M/10k ratio (target <= 1.2) and the plan of each
pass query at 1M.

    DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres /tmp/venv/bin/python bench/sweep.py

It creates (and drops) its own database on that server and uses its own Redis queue prefix.
Options: --sizes 10000,100000,1000000  --stuck 200  --repeats 7  --batch 50  --keep
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

RUN = uuid.uuid4().hex[:8]
BACKGROUND_SQL = """
INSERT INTO orders (reference, access_token, browser_id, email, status, total, currency, inventory_restored,
                    payment_session_id, payment_attempts, version, created_at, updated_at)
SELECT 'BN-' || g, 'tok', 'browser-' || (g % 5000), 'customer-' || (g % 200000) || '@example.com',
       s.status, 1400, 'usd', s.status = 'Cancelled',
       CASE WHEN s.status IN ('Paid', 'PaymentInitiated', 'PaymentFailed') THEN 'cs_bench_' || g END,
       1, 1, s.at, s.at
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
CROSS JOIN LATERAL (
    SELECT CASE
             WHEN g % 100 < 60 THEN 'Paid'
             WHEN g % 100 < 90 THEN 'Cancelled'
             WHEN g % 100 < 94 THEN 'PendingPayment'
             WHEN g % 100 < 98 THEN 'PaymentInitiated'
             ELSE 'PaymentFailed'
           END AS status,
           CASE
             -- live orders changed within the last 20 minutes: waiting, not stuck
             WHEN g % 100 >= 90 THEN now() - make_interval(secs => g % 1200)
             -- settled orders spread over the past year
             ELSE now() - make_interval(secs => 3600 + (g * 31) % 31536000)
           END AS at
) AS s
"""
STUCK_SQL = """
INSERT INTO orders (reference, access_token, browser_id, email, status, total, currency, inventory_restored,
                    payment_session_id, payment_attempts, version, created_at, updated_at)
SELECT 'ST-' || :round || '-' || g, 'tok', 'browser-stuck', 'bench@example.com',
       CASE WHEN g % 3 = 0 THEN 'PendingPayment' WHEN g % 3 = 1 THEN 'PaymentFailed' ELSE 'PaymentInitiated' END,
       1400, 'usd', false,
       CASE WHEN g % 3 = 0 THEN NULL ELSE 'cs_stuck_' || :round || '_' || g END,
       1, 1, now() - make_interval(secs => 7200 + g), now() - make_interval(secs => 7200 + g)
FROM generate_series(1, CAST(:count AS bigint)) AS g
"""
# Last round's leftovers leave the stuck set, so every round starts with exactly --stuck.
RETIRE_SQL = """
UPDATE orders SET status = 'Cancelled', version = version + 1
WHERE reference LIKE 'ST-%' AND status IN ('PendingPayment', 'PaymentFailed', 'PaymentInitiated')
"""


def server_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        sys.exit("bench/sweep.py needs DATABASE_URL naming a PostgreSQL server")
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--stuck", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="do not drop the bench database")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    server = make_url(server_url())
    name = f"backstop_bench_sweep_{RUN}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    logging.disable(logging.WARNING)  # the 503s are expected; keep the output to the figures

    from shop import create_app
    from shop.stripe_sandbox.testing import running_sandbox

    try:
        with running_sandbox(min_session_seconds=60) as sandbox:
            sandbox.faults(api_unavailable=True)
            app = create_app(
                {
                    "TESTING": True,
                    "SECRET_KEY": "bench",
                    "DATABASE_URL": url,
                    "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
                    "QUEUE_PREFIX": f"bench-sweep-{RUN}",
                    "STRIPE_API_BASE": sandbox.base_url,
                    "STRIPE_MAX_NETWORK_RETRIES": 0,
                    "RECONCILIATION_BATCH_SIZE": args.batch,
                }
            )
            logging.disable(logging.WARNING)
            with app.app_context():
                try:
                    run(app, sizes, args)
                finally:
                    _clean_redis()
                    from shop.extensions import db

                    db.session.remove()
                    db.engine.dispose()
    finally:
        if not args.keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(app, sizes, args) -> None:
    from flask_migrate import upgrade

    from shop.domain.deadlines import utcnow
    from shop.domain.order import UNPAID, OrderStatus
    from shop.extensions import db
    from shop.scheduling.stuck import stuck_query
    from shop.scheduling.sweep import run_cycle

    upgrade()
    print(
        f"PostgreSQL {db.session.execute(text('SHOW server_version')).scalar()}; "
        f"{args.stuck} stuck orders per round (1/3 each PendingPayment, PaymentFailed, PaymentInitiated), "
        f"batch {args.batch}, provider answering 503",
        flush=True,
    )
    medians, filled, round_no = {}, 0, 0
    for size in sizes:
        t0 = time.perf_counter()
        for first in range(filled + 1, size + 1, 250_000):
            last = min(size, first + 249_999)
            db.session.execute(text(BACKGROUND_SQL), {"first": first, "last": last})
            db.session.commit()
        filled = size
        db.session.commit()
        # A table in steady state, as autovacuum keeps a production one: visibility map and hint
        # bits set, statistics fresh, and the fill's dirty pages written out, so the timed cycles
        # measure the queries and not the aftermath of a bulk load.
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE) orders"))
            try:
                conn.execute(text("CHECKPOINT"))
            except Exception:  # not a superuser: the timings are just noisier
                pass
        fill_seconds = time.perf_counter() - t0
        times, counts = [], None
        for i in range(args.repeats + 1):  # the first round warms caches and is not counted
            round_no += 1
            db.session.execute(text(RETIRE_SQL))
            db.session.execute(text(STUCK_SQL), {"round": round_no, "count": args.stuck})
            db.session.commit()
            db.session.remove()
            start = time.perf_counter()
            result = run_cycle()
            elapsed = time.perf_counter() - start
            assert result.status == "ok", result.report_lines()
            if i > 0:
                times.append(elapsed)
            counts = result
        medians[size] = statistics.median(times)
        total = db.session.execute(text("SELECT count(*) FROM orders")).scalar()
        db.session.rollback()
        print(
            f"{total:>9,} orders (filled in {fill_seconds:6.1f} s): one cycle median {medians[size] * 1000:7.1f} ms "
            f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}, n={len(times)}); "
            f"{counts.expiry['cancelled']} cancelled, {counts.provider['unavailable']} provider-unavailable",
            flush=True,
        )
    small, large = min(sizes), max(sizes)
    print(f"ratio {large:,}/{small:,}: {medians[large] / medians[small]:.2f} (target <= 1.2)")

    cutoff = utcnow() - timedelta(seconds=app.config["RECONCILIATION_STUCK_AGE_SECONDS"])
    db.session.execute(text(RETIRE_SQL))
    db.session.execute(text(STUCK_SQL), {"round": round_no + 1, "count": args.stuck})
    db.session.commit()
    passes = [(f"expiry pass, {s.value}", stuck_query(s, cutoff, args.batch)) for s in UNPAID]
    passes.append(("provider pass", stuck_query(OrderStatus.PAYMENT_INITIATED, cutoff, args.batch, with_session=True)))
    for label, query in passes:
        sql = str(query.compile(db.engine, compile_kwargs={"literal_binds": True}))
        plan = db.session.execute(text("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)).scalars().all()
        db.session.rollback()
        print(f"\nEXPLAIN {label} at {large:,} orders:\n  " + "\n  ".join(plan))


def _clean_redis() -> None:
    """Drop what the cycles announced (our own queues and their jobs only)."""
    from shop import queue

    try:
        for q in (queue.control_queue(), queue.work_queue()):  # the shop's queues: JSON jobs
            q.empty()
            q.delete(delete_jobs=True)
    except Exception as exc:  # Redis down: nothing was announced either
        print(f"(could not clean Redis: {exc})")


if __name__ == "__main__":
    main()
