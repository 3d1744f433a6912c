"""Webhook throughput: POST /webhooks/stripe against the floor of a bare endpoint.

    /tmp/venv/bin/python bench/webhook.py [--clients 16] [--orders 1000] [--rounds 2] [--workers 4]

What it does
  1. Creates a fresh PostgreSQL database (`--database-url` names the server; default
     postgresql+psycopg://postgres@127.0.0.1:5432/postgres), migrates it, and builds real
     orders with real payment sessions: each order is placed, its Checkout Session created
     through the gateway (real SDK) at an in-process Stripe sandbox, and paid there; the
     sandbox's `checkout.session.completed` event bodies are kept byte for byte.
  2. Serves the bench's own app (bench/benchapp.py) with gunicorn (sync workers) and, per round,
     posts with N concurrent clients, each request Stripe-signed:
       bare : POST /_bench/bare-webhook  - verify the signature, insert one row, commit
       real : POST /webhooks/stripe      - the product path: verify, dedup by event id, load the
              order, PaymentProof, Paid transition, outbox event + delivery, receipt, commit,
              then enqueue the delivery to Redis
     The real round sends every event of that round's orders twice in a shuffled order (half
     the requests are redeliveries, some of them concurrent with their original).
     A last phase takes its own orders and posts each event once (first deliveries only), then
     each again (duplicates only), to split the cost of the two kinds.
  3. Prints accepted/s, p50, p99 and the gunicorn workers' CPU ms per request (utime + stime
     from /proc, so a loaded machine moves it less than the rates) per endpoint, the ratio
     real / bare by rate and by CPU (target >= 0.70), and checks that every order of a round
     ended Paid exactly once.

Everything it creates (database, gunicorn, Redis queue keys) is removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SECRET = "whsec_bench_webhook"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--orders", type=int, default=1000, help="orders (distinct events) per round")
    p.add_argument("--rounds", type=int, default=2, help="bare/real pairs, interleaved")
    p.add_argument(
        "--split-orders",
        type=int,
        default=500,
        help="orders for the first-delivery / duplicate-only phase (0 skips it)",
    )
    p.add_argument(
        "--workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY", 4)), help="gunicorn sync workers"
    )
    p.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"),
    )
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    return p.parse_args()


# -- database -------------------------------------------------------------------------------


def create_database(server_url: str) -> tuple[str, callable]:
    from scratchdb import make_database  # bench/scratchdb.py

    return make_database(server_url, "bench_webhook")


# -- fixtures: real orders, real sessions, real events ----------------------------------------


def build_events(app, sandbox, count: int) -> list[bytes]:
    """`count` orders paid at the sandbox; returns their completed events' exact bodies."""
    import secrets

    from sqlalchemy import insert

    from shop.domain.deadlines import utcnow
    from shop.extensions import db
    from shop.models import Order, OrderLine
    from shop.orders.checkout import new_reference
    from shop.payments.start import start_payment

    with app.app_context():
        now = utcnow()
        rows = [
            dict(
                reference=new_reference(),
                access_token=secrets.token_urlsafe(24),
                browser_id="bench",
                email="bench@example.com",
                status="PendingPayment",
                total=1400,
                currency="usd",
                inventory_restored=False,
                payment_attempts=0,
                version=1,
                created_at=now,
                updated_at=now,
            )
            for _ in range(count)
        ]
        ids = list(db.session.execute(insert(Order).returning(Order.id), rows).scalars())
        db.session.execute(
            insert(OrderLine),
            [
                dict(order_id=i, variant_id=1, sku="NB-A5-DOT", name="A5, dot grid", quantity=1, unit_price=1400)
                for i in ids
            ],
        )
        db.session.commit()
        db.session.remove()

    def pay(order_id: int) -> str:
        with app.app_context():
            started = start_payment(order_id)
            assert started.status == "started", started
            db.session.remove()
        session_id = started.url.rsplit("/", 1)[-1]
        sandbox.set_outcome(session_id, "paid")
        return session_id

    with ThreadPoolExecutor(8) as pool:
        sessions = set(pool.map(pay, ids))
    with sandbox.sandbox.lock:
        bodies = [
            r.body
            for r in sandbox.sandbox.events.values()
            if r.type == "checkout.session.completed" and r.session_id in sessions
        ]
    assert len(bodies) == count, (len(bodies), count)
    return bodies


# -- gunicorn -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(env: dict, workers: int, port: int, log_path: str) -> subprocess.Popen:
    gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [
            gunicorn,
            "--pythonpath",
            os.path.join(ROOT, "bench"),
            "benchapp:create_bench_app()",
            "--workers",
            str(workers),
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gunicorn exited with {proc.returncode}; see {log_path}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            # 503 is an answer too: this bench runs no worker or scheduler, so /healthz says so.
            if conn.getresponse().status in (200, 503):
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"gunicorn did not become healthy; see {log_path}")


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def workers_cpu_seconds(master_pid: int) -> float:
    """CPU used so far by the gunicorn master's worker processes."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == master_pid:
                total += _ticks(int(name))
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while we looked
    return total / os.sysconf("SC_CLK_TCK")


# -- load -----------------------------------------------------------------------------------


def sign(body: bytes, t: int) -> str:
    return f"t={t},v1=" + hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def blast(port: int, path: str, bodies: list[bytes], clients: int, master_pid: int | None = None) -> dict:
    """Post every body once, `clients` at a time; returns rate, latency and (given gunicorn's
    master pid) its workers' CPU per request."""
    t = int(time.time())
    requests = [(b, sign(b, t)) for b in bodies]
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    cursor = iter(range(len(requests)))

    def client():
        mine, codes = [], {}
        while True:
            with lock:
                i = next(cursor, None)
            if i is None:
                break
            body, sig = requests[i]
            started = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request(
                    "POST", path, body=body, headers={"Stripe-Signature": sig, "Content-Type": "application/json"}
                )
                response = conn.getresponse()
                response.read()
                code = response.status
            except OSError:
                code = 0
            finally:
                conn.close()
            mine.append(time.perf_counter() - started)
            codes[code] = codes.get(code, 0) + 1
        with lock:
            latencies.extend(mine)
            for k, v in codes.items():
                statuses[k] = statuses.get(k, 0) + v

    threads = [threading.Thread(target=client) for _ in range(clients)]
    cpu_before = workers_cpu_seconds(master_pid) if master_pid else 0.0
    began = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - began
    cpu = workers_cpu_seconds(master_pid) - cpu_before if master_pid else float("nan")
    latencies.sort()
    accepted = statuses.get(200, 0)
    return {
        "requests": len(requests),
        "accepted": accepted,
        "statuses": statuses,
        "wall": wall,
        "rate": accepted / wall,
        "p50": latencies[len(latencies) // 2] * 1000,
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "cpu_ms": cpu * 1000 / max(1, len(requests)),
    }


def check_round(app, bodies: list[bytes]) -> str:
    import json

    from sqlalchemy import func, select

    from shop.extensions import db
    from shop.models import Order, OutboxEvent

    ids = [int(json.loads(b)["data"]["object"]["metadata"]["order_id"]) for b in bodies]
    with app.app_context():
        paid = db.session.scalar(
            select(func.count()).select_from(Order).where(Order.id.in_(ids), Order.status == "Paid")
        )
        events = db.session.scalar(
            select(func.count())
            .select_from(OutboxEvent)
            .where(OutboxEvent.order_id.in_(ids), OutboxEvent.name == "OrderPaid")
        )
        db.session.remove()
    ok = paid == len(ids) and events == len(ids)
    return f"{paid}/{len(ids)} orders Paid, {events} OrderPaid events ({'ok' if ok else 'WRONG'})"


def main() -> int:
    args = parse_args()
    database_url, drop_database = create_database(args.database_url)
    prefix = f"bench-webhook-{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        SECRET_KEY="bench",
        STRIPE_WEBHOOK_SECRET=SECRET,
        REDIS_URL=args.redis_url,
        BACKSTOP_QUEUE_PREFIX=prefix,
        PUBLIC_BASE_URL="http://127.0.0.1:5000",
        STRIPE_SESSION_MIN_SECONDS="1800",
        # Setting up pays hundreds of orders at once: the provider's budgets (which would put the
        # later ones in line) are not what this bench measures.
        STRIPE_RATE_LIMIT_PER_SECOND="10000",
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND="10000",
    )
    env.pop("STRIPE_SECRET_KEY", None)
    os.environ.update(
        {
            k: env[k]
            for k in (
                "DATABASE_URL",
                "SECRET_KEY",
                "REDIS_URL",
                "BACKSTOP_QUEUE_PREFIX",
                "STRIPE_WEBHOOK_SECRET",
                "STRIPE_RATE_LIMIT_PER_SECOND",
                "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND",
            )
        }
    )
    import logging

    from flask_migrate import upgrade

    from shop import create_app
    from shop.extensions import db
    from shop.seed import seed_catalog
    from shop.stripe_sandbox.testing import running_sandbox

    proc = None
    try:
        with running_sandbox(min_session_seconds=60) as sandbox:
            os.environ["STRIPE_API_BASE"] = sandbox.base_url
            app = create_app()
            logging.getLogger().setLevel(logging.WARNING)
            with app.app_context():
                upgrade()
                seed_catalog()
                db.session.remove()
            warm_count = 50
            total = warm_count + args.orders * args.rounds + args.split_orders
            print(f"building {total} paid orders at the sandbox ...", flush=True)
            started = time.perf_counter()
            all_bodies = build_events(app, sandbox, total)
            print(f"  done in {time.perf_counter() - started:.1f}s", flush=True)
        env["STRIPE_API_BASE"] = "http://127.0.0.1:9"  # the sandbox is gone; completed events never call it

        port = free_port()
        proc = start_gunicorn(env, args.workers, port, os.path.join("/tmp", f"{prefix}-gunicorn.log"))
        rng = random.Random(7)
        # Warm-up on orders of their own, so every round's first deliveries are really first.
        warm, all_bodies = all_bodies[:warm_count], all_bodies[warm_count:]
        blast(port, "/_bench/bare-webhook", warm, args.clients)
        blast(port, "/webhooks/stripe", warm, args.clients)
        master = proc.pid

        results = {"bare": [], "real": []}
        for r in range(args.rounds):
            bodies = all_bodies[r * args.orders : (r + 1) * args.orders]
            bare = blast(port, "/_bench/bare-webhook", bodies * 2, args.clients, master)
            deliveries = bodies * 2
            rng.shuffle(deliveries)
            real = blast(port, "/webhooks/stripe", deliveries, args.clients, master)
            results["bare"].append(bare)
            results["real"].append(real)
            print(
                f"round {r + 1}: bare {bare['rate']:.0f}/s, real {real['rate']:.0f}/s; {check_round(app, bodies)}",
                flush=True,
            )
            for name, res in (("bare", bare), ("real", real)):
                if set(res["statuses"]) != {200}:
                    print(f"  {name}: statuses {res['statuses']}")

        split = {}
        if args.split_orders:
            bodies = all_bodies[args.rounds * args.orders :]
            split["first"] = blast(port, "/webhooks/stripe", bodies, args.clients, master)
            split["duplicate"] = blast(port, "/webhooks/stripe", bodies, args.clients, master)
            print(f"split: {check_round(app, bodies)}", flush=True)

        print()
        print(
            f"{args.clients} clients, gunicorn sync x{args.workers}, PostgreSQL, {args.orders} orders/round "
            f"(real: each event twice, shuffled)"
        )
        header = f"{'endpoint':<36}{'requests':>9}{'accepted/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms/req':>12}"
        print(header)
        summary, cpu = {}, {}

        def row(label, runs):
            rate = statistics.median(x["rate"] for x in runs)
            cpu_ms = statistics.median(x["cpu_ms"] for x in runs)
            print(
                f"{label:<36}{sum(x['requests'] for x in runs):>9}{rate:>12.0f}"
                f"{statistics.median(x['p50'] for x in runs):>9.1f}"
                f"{statistics.median(x['p99'] for x in runs):>9.1f}{cpu_ms:>12.2f}"
            )
            return rate, cpu_ms

        for name, label in (("bare", "bare (verify + insert 1 row)"), ("real", "POST /webhooks/stripe (mixed)")):
            summary[name], cpu[name] = row(label, results[name])
        for name in ("first", "duplicate"):
            if name in split:
                row(f"  {name} deliveries only", [split[name]])
        ratio = summary["real"] / summary["bare"]
        print(f"ratio real / bare by rate: {ratio:.2f} (target >= 0.70: {'met' if ratio >= 0.70 else 'MISSED'})")
        print(
            f"ratio real / bare by CPU : {cpu['bare'] / cpu['real']:.2f} "
            f"(bare CPU per request / real CPU per request; less sensitive to other load on the machine)"
        )
        return 0
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            from redis import Redis

            from shop.queue.connection import ShopQueue  # the shop's queues: JSON jobs

            conn = Redis.from_url(args.redis_url)
            for name in (f"{prefix}-work", f"{prefix}-control"):
                ShopQueue(name, connection=conn).empty()
            for key in conn.scan_iter(f"*{prefix}*"):
                conn.delete(key)
            conn.close()
        except Exception as exc:  # noqa: BLE001
            print(f"(could not clean Redis: {exc})")
        try:
            with app.app_context():
                db.engine.dispose()
        except Exception:  # noqa: BLE001
            pass
        drop_database()


if __name__ == "__main__":
    raise SystemExit(main())
