"""Does the operator console stay fast at a million orders? (not a test)

Fills its own PostgreSQL database to --orders orders with bulk INSERT ... SELECT generate_series
(bench/sweep.py's fill: mostly Paid and Cancelled over the past year, 10% live and recent) plus
stuck orders, one OrderPlaced event, delivery and deadline per order, the webhook of each paid one
(a few rejected), dead letters, open and resolved restore warnings and a history of sweep cycles;
then starts gunicorn serving the app,
logs an operator in over HTTP and times, one request at a time:

  dashboard   GET /console/                       (JSON)
  stuck       GET /console/orders?stuck=1         (JSON)
  search      GET /console/orders?q=<an email>    (JSON)
  order       GET /console/orders/<reference>     (JSON)

and prints p50/p99 of each (target p99 <= 150 ms), then every SQL statement each one issues
(captured in-process with SQLAlchemy's before_cursor_execute) with its EXPLAIN (ANALYZE, BUFFERS)
plan, marking any sequential scan of a big table; then the same plans, untimed, for the console's
other lists (every order newest first, a state filter, the outbox and its dead letters, restore
warnings, webhooks, sweeps, audit), so no page's query escapes the index check.

    DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres /work/main/.venv/bin/python bench/console.py

Options: --orders 1000000  --requests 200  --workers 2  --keep (do not drop the database)
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from checkout import BENCH_APP, BIN, CSRF, free_port, wait_http  # noqa: E402
from sweep import BACKGROUND_SQL, STUCK_SQL  # noqa: E402

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

OPERATOR, PASSWORD = "bench-operator@example.com", "bench-password-1"
STUCK = 3000
# One line per order (the order page and order_json read them).
LINES_SQL = """
INSERT INTO order_lines (order_id, variant_id, sku, name, quantity, unit_price)
SELECT o.id, v.id, v.sku, v.name, 1, o.total
FROM orders o CROSS JOIN (SELECT id, sku, name FROM variants ORDER BY id LIMIT 1) AS v
WHERE o.id BETWEEN :first AND :last
"""
EVENTS_SQL = """
INSERT INTO outbox_events (order_id, name, payload, created_at)
SELECT id, 'OrderPlaced', json_build_object('reference', reference, 'total', total, 'currency', currency), created_at
FROM orders WHERE id BETWEEN :first AND :last
"""
# One confirmation delivery per event; one in 2,500 dead (a mail server that refused it).
DELIVERIES_SQL = """
INSERT INTO outbox_deliveries (event_id, handler, order_id, status, attempts, max_attempts, next_attempt_at,
                               provider_waits, last_error, created_at, updated_at, completed_at)
SELECT e.id, 'send_order_confirmation', e.order_id, d.status, CASE WHEN d.status = 'dead' THEN 5 ELSE 1 END, 5,
       e.created_at, 0, CASE WHEN d.status = 'dead' THEN 'SMTPRecipientsRefused: bench' END,
       e.created_at, e.created_at, CASE WHEN d.status = 'done' THEN e.created_at END
FROM outbox_events e CROSS JOIN LATERAL (
    SELECT CASE WHEN e.order_id % 2500 = 7 THEN 'dead' ELSE 'done' END AS status) AS d
WHERE e.id BETWEEN :first AND :last
"""
# The webhook that paid each Paid order, and one rejected delivery in 10,000 (the webhooks page,
# its counts per outcome, the dashboard's rejected card and the order page read them).
WEBHOOKS_SQL = """
INSERT INTO webhook_receipts (event_id, event_type, outcome, reason, order_id, http_status, received_at)
SELECT 'evt_bench_' || id, 'checkout.session.completed', CASE WHEN id % 10000 = 17 THEN 'rejected' ELSE 'accepted' END,
       CASE WHEN id % 10000 = 17 THEN 'signature does not match (bench)' ELSE 'paid' END, id,
       CASE WHEN id % 10000 = 17 THEN 400 ELSE 200 END, updated_at
FROM orders WHERE status = 'Paid' AND id BETWEEN :first AND :last
"""
# Every order's payment deadline: done for settled orders, pending (due later) for live ones.
COMMANDS_SQL = """
INSERT INTO scheduled_commands (kind, order_id, payload, status, attempts, max_attempts, next_attempt_at,
                                provider_waits, created_at, updated_at, completed_at)
SELECT 'expire_unpaid_order', o.id, json_build_object('order_id', o.id), c.status, 0, 5,
       o.created_at + interval '30 minutes', 0, o.created_at, o.updated_at,
       CASE WHEN c.status = 'done' THEN o.updated_at END
FROM orders o CROSS JOIN LATERAL (
    SELECT CASE WHEN o.status IN ('Paid', 'Cancelled') THEN 'done' ELSE 'pending' END AS status) AS c
WHERE o.id BETWEEN :first AND :last
"""
DEAD_COMMANDS_SQL = """
INSERT INTO scheduled_commands (kind, order_id, payload, status, attempts, max_attempts, next_attempt_at,
                                provider_waits, last_error, created_at, updated_at)
SELECT 'refund_payment', id, json_build_object('refund_id', id), 'dead', 5, 5, updated_at, 0,
       'ProviderRefused: bench', updated_at, updated_at
FROM orders WHERE status = 'Cancelled' AND id % 5000 = 63
"""
WARNINGS_SQL = """
INSERT INTO restore_warnings (order_id, variant_id, quantity, reason, state, created_at, resolved_at)
SELECT id, 1, 1, 'no inventory row for variant 1 (bench)', CASE WHEN id % 4000 = 61 THEN 'resolved' ELSE 'open' END,
       updated_at, CASE WHEN id % 4000 = 61 THEN updated_at END
FROM orders WHERE status = 'Cancelled' AND id % 1000 = 61
"""
CYCLES_SQL = """
INSERT INTO reconciliation_cycles (started_at, finished_at, cutoff, status, expiry_counts, provider_counts, errors,
                                   holder)
SELECT now() - make_interval(secs => g * 600), now() - make_interval(secs => g * 600 - 2),
       now() - make_interval(secs => g * 600 + 1800), 'ok', '{"cancelled": 1}', '{"paid": 1}',
       CAST(CASE WHEN g % 10 = 0 THEN '[{"pass": "provider", "order_id": 5, "error": "ProviderRefused: bench"}]'
            ELSE '[]' END AS json), 'bench'
FROM generate_series(1, 2000) AS g
"""
# The rest of the console's GET pages: only their plans are printed (see the docstring).
OTHER_PAGES = [
    ("orders", "/console/orders"),
    ("orders page 3", "/console/orders?page=3"),
    ("orders by state", "/console/orders?status=PaymentFailed"),
    ("outbox", "/console/outbox"),
    ("dead letters", "/console/outbox?status=dead"),
    ("waiting", "/console/outbox?status=waiting"),
    ("restore warnings", "/console/restore-warnings?state=open"),
    ("webhooks", "/console/webhooks?outcome=rejected"),
    ("sweeps", "/console/sweeps"),
    ("audit", "/console/audit"),
]
BIG_TABLES = ("orders", "outbox_events", "outbox_deliveries", "scheduled_commands", "order_lines", "webhook_receipts")


def server_url() -> str:
    url = os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    if not url.startswith("postgres"):
        sys.exit("bench/console.py needs DATABASE_URL naming a PostgreSQL server")
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def chunks(total: int, size: int = 250_000):
    for first in range(1, total + 1, size):
        yield {"first": first, "last": min(total, first + size - 1)}


def fill(db, orders: int) -> None:
    from werkzeug.security import generate_password_hash

    from shop.models import Operator
    from shop.seed import seed_catalog

    seed_catalog()
    steps = [
        ("orders", BACKGROUND_SQL),
        ("lines", LINES_SQL),
        ("events", EVENTS_SQL),
        ("deliveries", DELIVERIES_SQL),
        ("deadlines", COMMANDS_SQL),
        ("webhooks", WEBHOOKS_SQL),
    ]
    for label, sql in steps:
        t0 = time.perf_counter()
        for params in chunks(orders):
            db.session.execute(text(sql), params)
            db.session.commit()
        print(f"  {label:<10} {time.perf_counter() - t0:6.1f} s", flush=True)
    # Orders stuck for hours (a third each PendingPayment, PaymentFailed, PaymentInitiated).
    db.session.execute(text(STUCK_SQL), {"round": 1, "count": STUCK})
    for sql in (DEAD_COMMANDS_SQL, WARNINGS_SQL, CYCLES_SQL):
        db.session.execute(text(sql))
    db.session.add(Operator(email=OPERATOR, password_hash=generate_password_hash(PASSWORD, "pbkdf2:sha256:1000")))
    db.session.commit()
    # A table in steady state, as autovacuum keeps a production one (see bench/sweep.py).
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE)"))
        try:
            conn.execute(text("CHECKPOINT"))
        except Exception:  # not a superuser: the timings are just noisier
            pass


class Client:
    """One operator's browser over plain HTTP: its cookies, one connection per request."""

    def __init__(self, port: int):
        self.port, self.cookies = port, {}

    def request(self, method, path, form=None, accept="application/json"):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = {"Accept": accept}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body, headers["Content-Type"] = urlencode(form), "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            for name, value in resp.getheaders():
                if name.lower() == "set-cookie":
                    key, _, rest = value.partition("=")
                    self.cookies[key.strip()] = rest.split(";", 1)[0]
            return resp.status, data
        finally:
            conn.close()

    def log_in(self):
        status, body = self.request("GET", "/console/login", accept="text/html")
        token = CSRF.search(body.decode()).group(1)
        status, body = self.request(
            "POST", "/console/login", {"csrf_token": token, "email": OPERATOR, "password": PASSWORD}, accept="text/html"
        )
        assert status == 303, (status, body[:300])


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def capture_plans(app, urls) -> None:
    """Every statement each page runs, with its plan, from an in-process request."""
    from shop.extensions import db

    with app.app_context():
        engine = db.engine
    statements = []

    def before(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") or statement.lstrip().upper().startswith("WITH"):
            statements.append((statement, parameters))

    client = app.test_client()
    token = CSRF.search(client.get("/console/login").get_data(as_text=True)).group(1)
    assert (
        client.post("/console/login", data={"csrf_token": token, "email": OPERATOR, "password": PASSWORD}).status_code
        == 303
    )
    event.listen(engine, "before_cursor_execute", before)
    try:
        for label, url in urls:
            statements.clear()
            assert client.get(url, headers={"Accept": "application/json"}).status_code == 200, url
            print(f"\n=== {label}: GET {url}: {len(statements)} statements", flush=True)
            seen = list(statements)
            statements.clear()
            with engine.connect() as conn:
                for i, (sql, params) in enumerate(seen, 1):
                    plan = [r[0] for r in conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)]
                    conn.rollback()
                    seq = [
                        line.strip()
                        for line in plan
                        if "Seq Scan on" in line and any(f"Seq Scan on {t} " in line + " " for t in BIG_TABLES)
                    ]
                    flag = "  <-- SEQ SCAN OF A BIG TABLE" if seq else ""
                    short = re.sub(r"\s+", " ", sql)[:300]
                    print(f"\n[{i}] {short}{flag}\n    " + "\n    ".join(plan), flush=True)
    finally:
        event.remove(engine, "before_cursor_execute", before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=200, help="timed requests per page")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--keep", action="store_true", help="do not drop the bench database")
    args = parser.parse_args()

    run_id = secrets.token_hex(4)
    server = make_url(server_url())
    name = f"backstop_bench_console_{run_id}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    secret = secrets.token_urlsafe(24)
    prefix = f"bench-console-{run_id}"
    procs: list[subprocess.Popen] = []
    logging.disable(logging.WARNING)
    try:
        from flask_migrate import upgrade

        from shop import create_app
        from shop.extensions import db

        app = create_app({"SECRET_KEY": secret, "DATABASE_URL": url, "REDIS_URL": args.redis, "QUEUE_PREFIX": prefix})
        logging.disable(logging.WARNING)
        with app.app_context():
            upgrade()
            print(
                f"PostgreSQL {db.session.execute(text('SHOW server_version')).scalar()}; filling to "
                f"{args.orders:,} orders (+{STUCK:,} stuck)",
                flush=True,
            )
            t0 = time.perf_counter()
            fill(db, args.orders)
            fill_seconds = time.perf_counter() - t0
            counts = {
                t: db.session.execute(text(f"SELECT count(*) FROM {t}")).scalar()
                for t in (
                    "orders",
                    "outbox_events",
                    "outbox_deliveries",
                    "scheduled_commands",
                    "order_lines",
                    "webhook_receipts",
                    "restore_warnings",
                    "reconciliation_cycles",
                )
            }
            mix = dict(db.session.execute(text("SELECT status, count(*) FROM orders GROUP BY status")).all())
            dead = db.session.execute(
                text(
                    "SELECT (SELECT count(*) FROM outbox_deliveries WHERE status = 'dead')"
                    " + (SELECT count(*) FROM scheduled_commands WHERE status = 'dead')"
                )
            ).scalar()
            warnings = db.session.execute(text("SELECT count(*) FROM restore_warnings WHERE state = 'open'")).scalar()
            # An order with a full timeline, and a customer with a handful of orders.
            reference = db.session.execute(
                text("SELECT reference FROM orders WHERE id = :id"), {"id": args.orders // 2 + 1}
            ).scalar()
            email = db.session.execute(
                text("SELECT email FROM orders WHERE id = :id"), {"id": args.orders // 3}
            ).scalar()
            db.session.rollback()
        print(f"filled in {fill_seconds:.1f} s: " + ", ".join(f"{n:,} {t}" for t, n in counts.items()), flush=True)
        print(
            "orders by state: "
            + ", ".join(f"{s} {n:,}" for s, n in sorted(mix.items()))
            + f"; {dead:,} dead letters; {warnings:,} open restore warnings",
            flush=True,
        )

        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "SECRET_KEY": secret,
            "REDIS_URL": args.redis,
            "BACKSTOP_QUEUE_PREFIX": prefix,
            "BACKSTOP_INSTANCE_PATH": f"/tmp/backstop-bench-{run_id}",
        }
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "gunicorn"),
                    *BENCH_APP,
                    "-b",
                    f"127.0.0.1:{port}",
                    "-w",
                    str(args.workers),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        wait_http(port, "/healthz", procs[0])
        client = Client(port)
        client.log_in()
        urls = [
            ("dashboard", "/console/"),
            ("stuck", "/console/orders?stuck=1"),
            ("search", "/console/orders?" + urlencode({"q": email})),
            ("order", f"/console/orders/{reference}"),
        ]
        print(
            f"\ngunicorn -w {args.workers}, one client, {args.requests} timed requests per page "
            f"(after {args.workers * 10} untimed)",
            flush=True,
        )
        results = {}
        for label, path in urls:
            for _ in range(args.workers * 10):
                status, body = client.request("GET", path)
                assert status == 200, (path, status, body[:300])
            times = []
            for _ in range(args.requests):
                t = time.perf_counter()
                status, body = client.request("GET", path)
                times.append((time.perf_counter() - t) * 1000)
                assert status == 200, (path, status)
            results[label] = times
            data = json.loads(body)
            size = (
                f"{len(data['orders'])} rows of {data['total']:,}"
                if "orders" in data
                else f"{len(data.get('timeline', []))} timeline entries"
                if "timeline" in data
                else ""
            )
            p50, p99 = statistics.median(times), percentile(times, 0.99)
            print(
                f"{label:<10} p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  max {max(times):6.1f} ms  "
                f"{'MET' if p99 <= 150 else 'MISSED'} (p99 <= 150 ms)  {path}  {size}",
                flush=True,
            )
        capture_plans(app, urls)
        print("\n##### the other console lists: plans only, untimed", flush=True)
        capture_plans(app, OTHER_PAGES)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            from shop.extensions import db

            with app.app_context():
                db.session.remove()
                db.engine.dispose()
        except Exception:
            pass
        if not args.keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
