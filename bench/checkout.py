"""Checkout throughput and latency over HTTP, against gunicorn on PostgreSQL (not a test).

    /tmp/venv/bin/python bench/checkout.py [--clients 16] [--orders 800] [--workers 4]

It creates and migrates a throwaway PostgreSQL database, seeds three variants with plenty of
stock, starts the Stripe sandbox (`flask shop stripe-sandbox`) and gunicorn serving the bench's own app
(bench/benchapp.py: the shop plus its bench-only routes) on free ports, then measures, each with N concurrent clients:

  bare      POST /_bench/bare-order: only the SQL of an order (prices, order, 3 lines, 3 decrements)
  checkout  POST /checkout of a prepared 3-item cart: the whole path (CSRF, session, cart, order,
            outbox, deadline, Redis announce, Checkout Session at the sandbox, PaymentInitiated)
  offline   POST /checkout on a second gunicorn whose provider fails fast (a stub answering 503
            with Stripe-Should-Retry: false): the order is placed, the session is not, the
            customer lands on the order page with "Pay now". The order's own cost, without the
            provider call; the same code path a customer meets during an outage
  cycle     a browser's full loop: GET /, 3 x POST /cart/items, POST /checkout (informational)

and prints orders/s, p50 and p99 for each, web CPU per order, and checkout/bare and
offline/bare ratios (target for checkout: >= 0.70 of the orders/s, p99 <= 1.5x). Before the
load it counts, in-process, what one request of each kind costs in round trips: SQL
statements, transactions, Redis round trips and provider requests, and what one Checkout Session
costs on its own (the SDK call here, the sandbox's CPU there): docs/REFERENCE.md, Storefront, makes every
checkout pay that, so bare / (bare + that) is the best checkout/bare ratio any code could reach
while the provider shares the machine's cores (--probe-only stops there).
Everything it started is stopped and the database dropped at the end.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import queue
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BENCH_APP = ["--pythonpath", str(ROOT / "bench"), "benchapp:create_bench_app()"]
CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_BROWSERS = itertools.count()


class Browser:
    """One browser: its own cookie jar and CSRF token, one short HTTP connection per request
    (gunicorn's sync workers close after each response), and its own address: each connects
    from another loopback address (all of 127/8 is this machine's), as customers come from
    theirs, so the front's per-address limits (deploy/nginx.conf) see many customers, not one."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}
        self.token = ""
        n = next(_BROWSERS)
        self.source = f"127.{1 + (n >> 16) % 254}.{(n >> 8) & 255}.{n & 255}"

    def request(self, method, path, form=None, accept="text/html"):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60, source_address=(self.source, 0))
        headers = {"Accept": accept}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            for name, value in resp.getheaders():
                if name.lower() == "set-cookie":
                    key, _, rest = value.partition("=")
                    self.cookies[key.strip()] = rest.split(";", 1)[0]
            return resp.status, resp.getheader("Location") or "", data
        finally:
            conn.close()

    def open_catalog(self):
        status, _, body = self.request("GET", "/")
        assert status == 200, status
        self.token = CSRF.search(body.decode()).group(1)

    def fill_cart(self, variant_ids):
        for v in variant_ids:
            status, _, body = self.request(
                "POST", "/cart/items", {"csrf_token": self.token, "variant_id": v, "quantity": 1}
            )
            assert status == 303, (status, body[:300])

    def checkout(self):
        status, location, body = self.request(
            "POST", "/checkout", {"csrf_token": self.token, "email": "bench@example.com"}
        )
        assert status == 303 and "/pay/" in location, (status, location, body[:300])

    def checkout_offline(self, port: int):
        """Check out on the app whose provider is down: placed, no session, sent to the order page."""
        self.port = port  # same database and SECRET_KEY: this browser's cookie and cart are valid there
        status, location, body = self.request(
            "POST", "/checkout", {"csrf_token": self.token, "email": "bench@example.com"}
        )
        assert status == 303 and "/orders/" in location, (status, location, body[:300])


# A provider that is down but says so at once: Stripe's 503 error shape with
# Stripe-Should-Retry: false, so the SDK does not sleep and retry (it would with a refused
# connection or a plain 503: the outage would then be measured as the SDK's backoff).
PROVIDER_DOWN = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BODY = json.dumps({"error": {"type": "api_error", "message": "bench: provider unavailable"}}).encode()
class Down(BaseHTTPRequestHandler):
    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Stripe-Should-Retry", "false")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    do_GET = do_POST = do_DELETE = answer
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Down).serve_forever()
"""


def run_clients(clients: int, jobs: queue.Queue, work) -> tuple[float, list[float]]:
    """`clients` threads take jobs until the queue is empty; returns (wall seconds, latencies)."""
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start_gate = threading.Barrier(clients + 1)

    def client():
        start_gate.wait()
        mine = []
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                break
            t0 = time.perf_counter()
            try:
                work(job)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                break
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    start_gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, latencies


def summarize(name: str, wall: float, lat: list[float]) -> dict:
    lat = sorted(lat)
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
    row = {
        "name": name,
        "n": len(lat),
        "rate": len(lat) / wall,
        "p50": p(0.50),
        "p99": p(0.99),
        "mean": statistics.fmean(lat) * 1000,
    }
    print(
        f"{name:<9} {row['n']:>6} orders  {row['rate']:8.1f} orders/s   p50 {row['p50']:7.1f} ms   "
        f"p99 {row['p99']:7.1f} ms",
        flush=True,
    )
    return row


def cpu_seconds(pids) -> float:
    """utime + stime of these processes (all their threads), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def wait_http(port: int, path: str, proc: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited early ({proc.returncode}): {' '.join(proc.args)}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing answered on port {port}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--orders", type=int, default=800, help="orders per measured phase")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY", "4")))
    ap.add_argument(
        "--server", default=os.environ.get("BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    )
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    ap.add_argument("--rounds", type=int, default=4, help="alternating bare/checkout rounds")
    ap.add_argument("--no-cycle", action="store_true", help="skip the full browser-loop phase")
    ap.add_argument("--probe-only", action="store_true", help="only count round trips per request (no load)")
    ap.add_argument("--show-sql", action="store_true", help="print the statements the probe counts")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also cProfile N in-process checkouts")
    args = ap.parse_args()

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    run_id = secrets.token_hex(4)
    server = make_url(args.server)
    dbname = f"backstop_bench_{run_id}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{dbname}"'))
    database_url = server.set(database=dbname).render_as_string(hide_password=False)
    prefix = f"bench-{run_id}"
    procs: list[subprocess.Popen] = []
    try:
        stock = 1_000_000_000
        variant_ids = seed(database_url, stock)
        sandbox_port, web_port = free_port(), free_port()
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "SECRET_KEY": secrets.token_urlsafe(24),
            "REDIS_URL": args.redis,
            "BACKSTOP_QUEUE_PREFIX": prefix,
            "STRIPE_API_BASE": f"http://127.0.0.1:{sandbox_port}",
            "STRIPE_SESSION_MIN_SECONDS": "60",
            "PUBLIC_BASE_URL": f"http://127.0.0.1:{web_port}",
            "STRIPE_WEBHOOK_SECRET": "whsec_bench",
            "BACKSTOP_INSTANCE_PATH": f"/tmp/backstop-bench-{run_id}",
            # The sandbox has no rate limit and this bench measures the order's path, not the
            # shared provider budget (bench/provider.py and bench/checkout_queue.py do): a budget
            # below the checkout rate would send orders to the pay-later path or the checkout
            # queue and measure those instead.
            "STRIPE_RATE_LIMIT_PER_SECOND": "10000",
            "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND": "10000",
        }
        env.pop("STRIPE_SECRET_KEY", None)
        quiet = subprocess.DEVNULL
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "flask"),
                    "--app",
                    "app",
                    "shop",
                    "stripe-sandbox",
                    "--port",
                    str(sandbox_port),
                    "--min-session-seconds",
                    "60",
                ],
                cwd=ROOT,
                env=env,
                stdout=quiet,
                stderr=quiet,
                start_new_session=True,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "gunicorn"),
                    *BENCH_APP,
                    "-b",
                    f"127.0.0.1:{web_port}",
                    "-w",
                    str(args.workers),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
                stdout=quiet,
                stderr=quiet,
                start_new_session=True,
            )
        )
        down_port, offline_port = free_port(), free_port()
        # Its own prefix: the failing provider opens the circuit breaker kept under the prefix in
        # Redis, which must not send the real checkout phase down the pay-later path.
        env_down = {
            **env,
            "STRIPE_API_BASE": f"http://127.0.0.1:{down_port}",
            "BACKSTOP_QUEUE_PREFIX": f"{prefix}-offline",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", PROVIDER_DOWN, str(down_port)],
                stdout=quiet,
                stderr=quiet,
                start_new_session=True,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "gunicorn"),
                    *BENCH_APP,
                    "-b",
                    f"127.0.0.1:{offline_port}",
                    "-w",
                    str(args.workers),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env_down,
                stdout=quiet,
                stderr=quiet,
                start_new_session=True,
            )
        )
        wait_http(sandbox_port, "/_sandbox/events", procs[0])
        wait_http(web_port, "/healthz", procs[1])
        wait_http(down_port, "/", procs[2])
        wait_http(offline_port, "/healthz", procs[3])
        print(
            f"gunicorn -w {args.workers} on PostgreSQL, {args.clients} clients, {args.orders} orders per "
            f"phase, 3 lines per order; sandbox on :{sandbox_port}",
            flush=True,
        )
        trips = probe(env, variant_ids, args.profile, args.show_sql, provider_pid=procs[0].pid)
        trips["offline"] = probe(env_down, variant_ids, 0, args.show_sql, bare=False)["checkout"]
        floor = trips.pop("provider_floor")
        for name, c in trips.items():
            print(
                f"{name:<9} per request: {c['sql']} SQL statements in {c['tx']} transactions, {c['redis']} Redis "
                f"round trips, {c['http']} provider requests ({c['connect']} new connections); "
                f"{c['cpu_ms']:.1f} ms CPU in-process",
                flush=True,
            )
        provider_cost = floor["sdk_ms"] + floor["provider_ms"]
        print(
            f"provider  one Checkout Session, nothing else: {floor['sdk_ms']:.1f} ms CPU in the SDK here + "
            f"{floor['provider_ms']:.1f} ms in the sandbox; on shared cores no checkout can beat bare x"
            f"{trips['bare']['cpu_ms'] / (trips['bare']['cpu_ms'] + provider_cost):.2f} (in-process figures)",
            flush=True,
        )
        if args.probe_only:
            return

        bare_path = "/_bench/bare-order?variants=" + ",".join(map(str, variant_ids))

        def bare(_):
            status, _, body = Browser(web_port).request("POST", bare_path)
            assert status == 201, (status, body[:200])

        def prepare(n):
            ready = queue.Queue()

            def make(_):
                b = Browser(web_port)
                b.open_catalog()
                b.fill_cart(variant_ids)
                ready.put(b)

            run_clients(args.clients, _jobs(n), make)
            return ready

        def offline(b):
            b.checkout_offline(offline_port)

        # Warm every worker (imports, pools, templates) before measuring anything.
        run_clients(args.clients, _jobs(4 * args.workers), bare)
        run_clients(args.clients, prepare(4 * args.workers), Browser.checkout)
        run_clients(args.clients, prepare(4 * args.workers), offline)

        # Interleave the phases in rounds: this machine is shared, so load that comes and goes
        # hits both sides alike. Web CPU per order (gunicorn workers, from /proc) is the figure
        # least disturbed by other load; throughput and latency are reported as measured.
        workers = children(procs[1].pid) + children(procs[3].pid)
        web_cpu = lambda: cpu_seconds(workers)  # noqa: E731
        sandbox_cpu = lambda: cpu_seconds([procs[0].pid, procs[2].pid])  # noqa: E731
        per_round = max(1, args.orders // args.rounds)
        carts = prepare(2 * per_round * args.rounds)
        totals = {name: [0.0, [], 0.0, 0.0] for name in ("bare", "checkout", "offline")}
        for _ in range(args.rounds):
            for name, jobs, work in (
                ("bare", _jobs(per_round), bare),
                ("checkout", _take(carts, per_round), Browser.checkout),
                ("offline", _take(carts, per_round), offline),
            ):
                cpu0, sb0 = web_cpu(), sandbox_cpu()
                wall, lat = run_clients(args.clients, jobs, work)
                t = totals[name]
                t[0] += wall
                t[1] += lat
                t[2] += web_cpu() - cpu0
                t[3] += sandbox_cpu() - sb0
        results = {}
        for name, (wall, lat, cpu, sb) in totals.items():
            results[name] = summarize(name, wall, lat)
            results[name]["cpu"] = cpu / len(lat) * 1000
            print(
                f"{'':<9} web CPU {results[name]['cpu']:.2f} ms/order, provider CPU {sb / len(lat) * 1000:.2f} ms/order"
            )
        if not args.no_cycle:

            def cycle(_):
                b = Browser(web_port)
                b.open_catalog()
                b.fill_cart(variant_ids)
                b.checkout()

            cpu0 = web_cpu()
            results["cycle"] = summarize("cycle", *run_clients(args.clients, _jobs(per_round), cycle))
            print(f"{'':<9} web CPU {(web_cpu() - cpu0) / per_round * 1000:.2f} ms/order")

        b, c = results["bare"], results["checkout"]
        rate_ratio, p99_ratio = c["rate"] / b["rate"], c["p99"] / b["p99"]
        print(
            f"checkout/bare: web CPU per order x{c['cpu'] / b['cpu']:.2f} (so at most x{b['cpu'] / c['cpu']:.2f} "
            "of the orders/s once the web processes are the bottleneck)"
        )
        print(
            f"checkout/bare ceiling from the provider call alone (section 4's 303 to the hosted page): "
            f"x{b['cpu'] / (b['cpu'] + provider_cost):.2f} of the orders/s, with bare's web CPU "
            f"{b['cpu']:.2f} ms + {provider_cost:.2f} ms for one session (SDK + sandbox)"
        )
        print(
            f"checkout/bare: orders/s x{rate_ratio:.2f} (target >= 0.70), p99 x{p99_ratio:.2f} (target <= 1.5)"
            f"  -> {'MET' if rate_ratio >= 0.70 and p99_ratio <= 1.5 else 'MISSED'}"
        )
        o = results["offline"]
        print(
            f"offline/bare (the order without the provider call): orders/s x{o['rate'] / b['rate']:.2f}, "
            f"p99 x{o['p99'] / b['p99']:.2f}, web CPU per order x{o['cpu'] / b['cpu']:.2f}"
        )
        if "cycle" in results:
            print(
                f"full browser loop/bare: orders/s x{results['cycle']['rate'] / b['rate']:.2f}, "
                f"p99 x{results['cycle']['p99'] / b['p99']:.2f} (5 requests per order)"
            )
        check_conservation(database_url, variant_ids, stock)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
        admin.dispose()
        forget_redis(args.redis, prefix)


def probe(
    env: dict, variant_ids, profile: int = 0, show_sql: bool = False, bare: bool = True, provider_pid: int | None = None
) -> dict:
    """One checkout in this process (Flask test client, same database, sandbox and Redis as the
    served app), counting what it costs in round trips: SQL statements and transactions, Redis
    round trips, provider HTTP requests and new TCP connections to the provider; then the
    mean CPU of 40 more (this thread only: no HTTP server, no load from other clients). With
    `profile` > 0, also cProfile that many checkouts and print the top entries."""
    import cProfile
    import logging
    import pstats

    import redis.connection
    import requests
    import urllib3.connection
    from benchapp import create_bench_app
    from sqlalchemy import event

    from shop.extensions import db

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        app = create_bench_app({"WTF_CSRF_ENABLED": True})
    finally:
        os.environ.clear()
        os.environ.update(saved)
    logging.getLogger("shop.payments").setLevel(logging.ERROR)  # the offline probe's expected warning
    counts = {"sql": 0, "tx": 0, "redis": 0, "http": 0, "connect": 0}
    found = {}
    counting = [False]

    def bump(key):
        if counting[0]:
            counts[key] += 1

    with app.app_context():
        engine = db.engine

    def statement(_conn, _cursor, sql, *_rest):
        bump("sql")
        if counting[0] and show_sql:
            print("   ", " ".join(sql.split())[:150])

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", lambda *a: bump("tx"))
    patched = []

    def wrap(owner, name, key):
        original = getattr(owner, name)

        def counted(*a, **k):
            bump(key)
            return original(*a, **k)

        setattr(owner, name, counted)
        patched.append((owner, name, original))

    # A pipeline is one send of all its packed commands: one round trip.
    wrap(redis.connection.AbstractConnection, "send_packed_command", "redis")
    wrap(requests.Session, "send", "http")
    wrap(urllib3.connection.HTTPConnection, "connect", "connect")
    try:

        def browser():
            c = app.test_client()
            page = c.get("/").get_data(as_text=True)
            token = CSRF.search(page).group(1)
            for v in variant_ids:
                r = c.post("/cart/items", data={"csrf_token": token, "variant_id": v, "quantity": 1})
                assert r.status_code == 303, r.status_code
            return c, token

        def checkout(c, token):
            r = c.post("/checkout", data={"csrf_token": token, "email": "bench@example.com"})
            assert r.status_code == 303, (r.status_code, r.get_data()[:300])  # to /pay/ or, provider down, the order

        def bare_order():
            r = app.test_client().post("/_bench/bare-order?variants=" + ",".join(map(str, variant_ids)))
            assert r.status_code == 201, r.status_code

        def count(fn, *a):
            for key in counts:
                counts[key] = 0
            counting[0] = True
            try:
                fn(*a)
            finally:
                counting[0] = False
            return dict(counts)

        def cpu_ms(fn, calls) -> float:
            """This thread's CPU per request (the sandbox, PostgreSQL and Redis are other processes)."""
            t0 = time.thread_time()
            for a in calls:
                fn(*a)
            return (time.thread_time() - t0) / len(calls) * 1000

        checkout(*browser())  # warm: imports, pools, the stripe client, templates
        found["checkout"] = count(checkout, *browser())
        found["checkout"]["cpu_ms"] = cpu_ms(checkout, [browser() for _ in range(40)])
        if bare:
            bare_order()
            found["bare"] = count(bare_order)
            found["bare"]["cpu_ms"] = cpu_ms(bare_order, [()] * 40)
        if provider_pid is not None:
            found["provider_floor"] = provider_call_cpu(app, provider_pid)
        if profile:
            carts = [browser() for _ in range(profile)]
            prof = cProfile.Profile(time.thread_time)  # CPU, not waiting on the database or the provider
            prof.enable()
            for c, token in carts:
                checkout(c, token)
            prof.disable()
            if os.environ.get("BENCH_PROFILE_DUMP"):
                prof.dump_stats(os.environ["BENCH_PROFILE_DUMP"])
            stats = pstats.Stats(prof)
            stats.sort_stats("cumulative").print_stats(int(os.environ.get("BENCH_PROFILE_LINES", "45")))
            stats.sort_stats("tottime").print_stats(25)
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)
        with app.app_context():
            db.engine.dispose()
    return found


def provider_call_cpu(app, provider_pid: int, calls: int = 40) -> dict:
    """What docs/REFERENCE.md, Storefront, adds to every checkout whatever the code around it does: one
    Checkout Session created through the real SDK (CPU in this thread) and served by the
    provider (CPU of the sandbox process, which shares this machine's cores in the bench)."""
    from datetime import timedelta
    from types import SimpleNamespace

    from shop.domain.deadlines import utcnow
    from shop.provider import gateway

    line = SimpleNamespace(quantity=1, unit_price=1000, name="Bench", sku="BENCH-0")
    with app.test_request_context():

        def one(i):
            gateway.create_checkout_session(
                order_id=10_000_000 + i,
                reference=f"BK-FLOOR{i:04d}",
                attempt=1,
                lines=[line] * 3,
                currency="usd",
                email="bench@example.com",
                expires_at=utcnow() + timedelta(hours=1),
                success_url="http://127.0.0.1/ok?session_id={CHECKOUT_SESSION_ID}",
                cancel_url="http://127.0.0.1/no",
            )

        one(calls)  # warm
        sdk0, sb0 = time.thread_time(), cpu_seconds([provider_pid])
        for i in range(calls):
            one(i)
        return {
            "sdk_ms": (time.thread_time() - sdk0) / calls * 1000,
            "provider_ms": (cpu_seconds([provider_pid]) - sb0) / calls * 1000,
        }


def _take(source: queue.Queue, n: int) -> queue.Queue:
    q = queue.Queue()
    for _ in range(n):
        q.put(source.get_nowait())
    return q


def _jobs(n: int) -> queue.Queue:
    q = queue.Queue()
    for i in range(n):
        q.put(i)
    return q


def seed(database_url: str, stock: int) -> list[int]:
    from flask_migrate import upgrade

    from shop import create_app
    from shop.extensions import db
    from shop.models import InventoryItem, Product, Variant

    app = create_app({"DATABASE_URL": database_url, "SECRET_KEY": "bench"})
    with app.app_context():
        upgrade()
        product = Product(slug="bench", name="Bench product", description="")
        db.session.add(product)
        db.session.flush()
        ids = []
        for i in range(3):
            v = Variant(product_id=product.id, sku=f"BENCH-{i}", name=f"Bench {i}", price=1000 + i, currency="usd")
            db.session.add(v)
            db.session.flush()
            db.session.add(InventoryItem(variant_id=v.id, on_hand=stock))
            ids.append(v.id)
        db.session.commit()
        db.engine.dispose()
    return ids


def check_conservation(database_url, variant_ids, stock) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    with engine.connect() as conn:
        for v in variant_ids:
            on_hand = conn.execute(text("SELECT on_hand FROM inventory WHERE variant_id = :v"), {"v": v}).scalar()
            sold = conn.execute(
                text("SELECT coalesce(sum(quantity), 0) FROM order_lines WHERE variant_id = :v"), {"v": v}
            ).scalar()
            assert on_hand + sold == stock, (v, on_hand, sold)
        orders = conn.execute(text("SELECT status, count(*) FROM orders GROUP BY status ORDER BY 1")).all()
    engine.dispose()
    print("stock conserved on every variant; orders by status:", dict(orders))


def forget_redis(url: str, prefix: str) -> None:
    try:
        from redis import Redis

        r = Redis.from_url(url)
        for key in r.scan_iter(match=f"*{prefix}*", count=1000):
            r.delete(key)
        for zset in r.scan_iter(match="rq:scheduler*", count=100):
            if r.type(zset) == b"zset":
                stale = [m for m in r.zrange(zset, 0, -1) if m.decode().startswith(prefix)]
                if stale:
                    r.zrem(zset, *stale)
        r.close()
    except Exception as exc:  # noqa: BLE001 - cleanup is best effort
        print(f"(could not clean Redis keys {prefix}*: {exc})")


if __name__ == "__main__":
    main()
