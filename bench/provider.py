"""The storefront against a slow, failing and overloaded provider (not a test).

    /work/main/.venv/bin/python bench/provider.py [--orders 300] [--clients 32] [--brownout-seconds 12]

Runs the Procfile's web line (gunicorn, threaded workers, WEB_CONCURRENCY x WEB_THREADS from
the environment or their defaults) on a throwaway PostgreSQL database, with the Stripe sandbox
(`flask shop stripe-sandbox`) as the provider and its `api_latency_seconds` fault as the delay,
and prints in one run:

  latency 0 / 0.3   checkout orders/s and p99 at 0 s and 0.3 s per provider call, 32 clients,
                    counting only checkouts that reached the hosted payment page (target: the
                    0.3 s rate >= 0.90 of the 0 s rate), in alternating rounds
  paced 0 / 0.3     the same two latencies open-loop: customers arrive at a fixed rate (2/3 of
                    the 0 s closed-loop rate) whatever the answers; the rate served at 0.3 s
                    against 0 s (target >= 0.90) and the p99 each adds. 32 closed-loop clients
                    cannot show latency hiding once the shop outruns 32 / 0.3 s = 107/s
  brownout          catalog p50/p99 (4 browsing clients, in a process of their own) while 5 s per provider call holds
                    twice as many checkout clients as the web has threads (target p99 <= 100 ms,
                    no 5xx). The breaker is held off here (BACKSTOP_STRIPE_BREAKER_THRESHOLD),
                    so the checkouts keep waiting on the provider for the whole phase. Shoppers
                    arrive over 5 s and one sent to "Pay now" checks out again after 2.5 to 7.5 s
                    (--lockstep: all at once, back after exactly 5 s, so every slot's timeout and
                    the next wave land together: the worst case)
  breaker open      checkout p99 (8 clients) once the provider has failed past the breaker's
                    threshold (target <= 200 ms); the web is restarted with the default threshold
  overload          the peak provider calls in any one second at the sandbox while 64 clients
                    check out as fast as they can against STRIPE_RATE_LIMIT_PER_SECOND=30
                    (target <= 30)
  CPU               web CPU per order with the provider call (latency 0) and without it
                    (breaker open: the order is placed, no call is made)

Everything it started is stopped and the database dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.request import Request, urlopen

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkout import (
    ROOT,
    Browser,
    _jobs,
    children,
    cpu_seconds,
    forget_redis,
    free_port,
    run_clients,  # noqa: E402
    seed,
    wait_http,
)
from scratchdb import make_database  # noqa: E402

sys.path.insert(0, str(ROOT))
from shop.settings import DEFAULT_WEB_CONCURRENCY, DEFAULT_WEB_THREADS  # noqa: E402
from shop.stripe_sandbox.testing import peak_in_window  # noqa: E402

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

BIN = Path(sys.executable).parent


def procfile_web() -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit("no web line in the Procfile")


class Shop:
    def __init__(self, args):
        self.args = args
        self.run_id = secrets.token_hex(4)
        self.prefix = f"bench-provider-{self.run_id}"
        self.procs: list[subprocess.Popen] = []
        self.web: subprocess.Popen | None = None

    def sandbox(self, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = Request(
            f"http://127.0.0.1:{self.sandbox_port}{path}",
            data=data,
            headers={"Content-Type": "application/json"},
            method="POST" if body is not None else "GET",
        )
        with urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def faults(self, **faults):
        self.sandbox("/_sandbox/faults", faults)

    def call_times(self, since: float) -> list[float]:
        calls = self.sandbox(f"/_sandbox/requests?since={since!r}")["calls"]
        return sorted(c["at"] for c in calls if c["path"].startswith("/v1"))

    def boot(self, database_url: str, redis_url: str, instance: str, **extra_env) -> subprocess.Popen:
        """The environment every process of the bench's shop shares (`extra_env` on top), and the
        Stripe sandbox (`flask shop stripe-sandbox`) on a free port; returns the sandbox."""
        self.sandbox_port, self.web_port = free_port(), free_port()
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "SECRET_KEY": secrets.token_urlsafe(24),
            "REDIS_URL": redis_url,
            "BACKSTOP_QUEUE_PREFIX": self.prefix,
            "STRIPE_API_BASE": f"http://127.0.0.1:{self.sandbox_port}",
            "STRIPE_SESSION_MIN_SECONDS": "60",
            "PUBLIC_BASE_URL": f"http://127.0.0.1:{self.web_port}",
            "STRIPE_WEBHOOK_SECRET": "whsec_bench",
            "BACKSTOP_INSTANCE_PATH": instance,
            **extra_env,
        }
        self.env.pop("STRIPE_SECRET_KEY", None)
        sandbox = subprocess.Popen(
            [
                str(BIN / "flask"),
                "--app",
                "app",
                "shop",
                "stripe-sandbox",
                "--port",
                str(self.sandbox_port),
                "--min-session-seconds",
                "60",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(sandbox)
        wait_http(self.sandbox_port, "/_sandbox/events", sandbox)
        return sandbox

    def start_web(self, **extra):
        if self.web is not None:
            os.killpg(self.web.pid, signal.SIGTERM)
            self.web.wait(timeout=30)
        env = {
            **self.env,
            **extra,
            "PORT": str(self.web_port),
            "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", ""),
        }
        self.web = subprocess.Popen(
            ["sh", "-c", f"exec {procfile_web()} --log-level warning"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(self.web)
        wait_http(self.web_port, "/", self.web)

    def web_cpu(self) -> float:
        return cpu_seconds(children(self.web.pid))

    def stop(self) -> None:
        """Every process this bench started, newest first: SIGTERM, then SIGKILL after 15 s."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def summarize(name: str, wall: float, lat: list[float]) -> dict:
    lat = sorted(lat)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")  # noqa: E731
    row = {"n": len(lat), "rate": len(lat) / wall if wall else 0.0, "p50": pct(0.5), "p99": pct(0.99)}
    print(
        f"{name:<14} {row['n']:>5} in {wall:5.1f} s  {row['rate']:7.1f}/s   p50 {row['p50']:7.1f} ms   "
        f"p99 {row['p99']:7.1f} ms",
        flush=True,
    )
    return row


def paced(rate: float, jobs: queue.Queue, work, threads: int = 160) -> tuple[float, list[float], int]:
    """Open loop: job i is sent at start + i/rate whatever the answers before it (a shop's
    customers do not wait for each other). Latency counts from the time the job was due, so a
    request held back because every client thread was busy still counts its wait (no coordinated
    omission). Returns (wall seconds from start to the last answer, latencies, jobs sent late)."""
    total = jobs.qsize()
    lock = threading.Lock()
    latencies: list[float] = []
    late = [0]
    counter = iter(range(total))
    start = time.perf_counter() + 0.2

    def client():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            elif pause < -0.01:
                with lock:
                    late[0] += 1
            work(jobs.get_nowait())
            with lock:
                latencies.append(time.perf_counter() - due)

    pool = [threading.Thread(target=client, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - start, latencies, late[0]


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _browse(port: int, seconds: float, clients: int, out) -> None:
    """A browsing customer's catalog GETs, in a process of its own: in the bench's process it
    would wait for the GIL behind the hundreds of checkout threads and measure the bench."""
    sys.path.insert(0, str(ROOT))
    stop = time.monotonic() + seconds
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def browse():
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            status, _, _ = Browser(port).request("GET", "/", accept="application/json")
            with lock:
                lat.append(time.perf_counter() - t0)
                errors[0] += status >= 500
            time.sleep(0.05)

    pool = [threading.Thread(target=browse) for _ in range(clients)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put((lat, errors[0]))


def browse_in_own_process(port: int, seconds: float, clients: int = 4) -> tuple[list[float], int]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_browse, args=(port, seconds, clients, out), daemon=True)
    proc.start()
    result = out.get(timeout=seconds + 60)
    proc.join(timeout=10)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=300, help="orders per checkout phase")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--brownout-seconds", type=float, default=12)
    ap.add_argument("--paced-seconds", type=float, default=6, help="length of each open-loop latency phase")
    ap.add_argument(
        "--server", default=os.environ.get("BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    )
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    ap.add_argument("--latency-only", action="store_true", help="only the 0 s / 0.3 s checkout phases")
    ap.add_argument("--skip-latency", action="store_true", help="start with the brownout")
    ap.add_argument(
        "--lockstep",
        action="store_true",
        help="brownout shoppers all arrive at once and come back after exactly 5 s (the worst case)",
    )
    args = ap.parse_args()

    shop = Shop(args)
    database_url, drop = make_database(args.server, "provider")
    try:
        stock = 1_000_000_000
        variant = seed(database_url, stock)[0]
        shop.boot(database_url, args.redis, f"/tmp/backstop-bench-{shop.run_id}")
        processes = int(os.environ.get("WEB_CONCURRENCY") or DEFAULT_WEB_CONCURRENCY)
        threads = int(os.environ.get("WEB_THREADS") or DEFAULT_WEB_THREADS)
        print(
            f"web: {procfile_web()}\n     = {processes} processes x {threads} threads on PostgreSQL; "
            f"{args.clients} clients, {args.orders} orders per checkout phase",
            flush=True,
        )
        # The latency and brownout phases measure how threads hide the provider's latency, not
        # the rate budget (the overload phase below does, and bench/checkout_queue.py): a budget
        # below the checkout rate would send the 0 s phase to the checkout queue and measure
        # the budget instead.
        shop.start_web(
            BACKSTOP_STRIPE_BREAKER_THRESHOLD="1000000",
            STRIPE_RATE_LIMIT_PER_SECOND="10000",
            STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND="10000",
        )

        def prepared(n: int) -> queue.Queue:
            ready: queue.Queue = queue.Queue()

            def make(_):
                b = Browser(shop.web_port)
                b.open_catalog()
                b.fill_cart([variant])
                ready.put(b)

            run_clients(args.clients, _jobs(n), make)
            return ready

        outcomes = {"pay": 0, "later": 0, "5xx": 0}
        lock = threading.Lock()

        def checkout(b: Browser) -> str:
            status, location, _ = b.request("POST", "/checkout", {"csrf_token": b.token, "email": "b@example.com"})
            kind = "5xx" if status >= 500 else "pay" if "/pay/" in location else "later"
            with lock:
                outcomes[kind] += 1
            return kind

        def checkout_phase(name: str, latency: float, rounds: int) -> dict:
            """Alternating rounds (the machine is shared: load that comes and goes hits both sides)."""
            totals = {"wall": 0.0, "lat": [], "cpu": 0.0, "pay": 0, "later": 0}
            for _ in range(rounds):
                yield
                shop.faults(api_latency_seconds=latency)
                carts = prepared(args.orders // rounds)
                outcomes.update(pay=0, later=0)
                cpu0 = shop.web_cpu()
                wall, lat = run_clients(args.clients, carts, checkout)
                totals["wall"] += wall
                totals["lat"] += lat
                totals["cpu"] += shop.web_cpu() - cpu0
                totals["pay"] += outcomes["pay"]
                totals["later"] += outcomes["later"]
            row = summarize(name, totals["wall"], totals["lat"])
            row["cpu_ms"] = totals["cpu"] / len(totals["lat"]) * 1000
            row["rate"] = totals["pay"] / totals["wall"]  # orders that reached the payment page
            print(
                f"{'':<14} {totals['pay']} to the payment page ({row['rate']:.1f}/s), {totals['later']} "
                f"pay-later; web CPU {row['cpu_ms']:.2f} ms/order",
                flush=True,
            )
            yield row

        fast = None
        if not args.skip_latency:
            run_clients(args.clients, prepared(2 * args.clients), checkout)  # warm every thread and pool
            rounds = 3
            phases = [checkout_phase("latency 0 s", 0.0, rounds), checkout_phase("latency 0.3 s", 0.3, rounds)]
            for phase in phases:
                next(phase)
            rows = [None, None]
            for _ in range(rounds):
                for i, phase in enumerate(phases):
                    rows[i] = next(phase)  # the row, after the last round
            fast, slow = rows
            ratio = slow["rate"] / fast["rate"]
            cap = args.clients / 0.3
            print(
                f"checkout at 0.3 s / at 0 s: x{ratio:.2f} of the orders/s (target >= 0.90) -> "
                f"{'MET' if ratio >= 0.90 else 'MISSED'}; p99 {fast['p99']:.0f} -> {slow['p99']:.0f} ms"
                + (
                    f" (closed loop: {args.clients} clients waiting 0.3 s each cannot ask more than {cap:.0f}/s, "
                    f"x{cap / fast['rate']:.2f} of the 0 s rate; the paced phase below measures the shop)"
                    if cap < 0.9 * fast["rate"]
                    else ""
                ),
                flush=True,
            )
            # The same question asked open-loop: a fixed rate of customers arriving, whatever the
            # answers, at two thirds of what the shop served at 0 s. 32 closed-loop clients cannot
            # ask it: each waits out its own 0.3 s, which caps them at 32 / 0.3 s = 107/s whatever
            # the server does, below the 0 s rate on this machine.
            offered = max(10.0, round(fast["rate"] * 2 / 3))
            paced_rows = {}
            for latency in (0.0, 0.3):
                shop.faults(api_latency_seconds=latency)
                carts = prepared(int(offered * args.paced_seconds))
                outcomes.update(pay=0, later=0, **{"5xx": 0})
                wall, lat, late = paced(offered, carts, checkout)
                row = summarize(f"paced {latency:g} s", wall, lat)
                # Served: the arrivals that reached the payment page, per second of arrivals (the
                # wall time would also count the last answer's latency: 5% of a 6-s phase at 0.3 s).
                row["served"] = outcomes["pay"] / len(lat) * offered
                paced_rows[latency] = row
                print(
                    f"{'':<14} offered {offered:.0f}/s: {outcomes['pay']} to the payment page ({row['served']:.1f}/s), "
                    f"{outcomes['later']} pay-later, {outcomes['5xx']} 5xx, {late} sent late",
                    flush=True,
                )
            shop.faults(api_latency_seconds=0)
            hidden = paced_rows[0.3]["served"] / paced_rows[0.0]["served"]
            added = paced_rows[0.3]["p99"] - paced_rows[0.0]["p99"]
            print(
                f"paced at {offered:.0f}/s, 0.3 s / 0 s: x{hidden:.2f} of the orders/s (target >= 0.90) -> "
                f"{'MET' if hidden >= 0.90 else 'MISSED'}; p99 {paced_rows[0.0]['p99']:.0f} -> "
                f"{paced_rows[0.3]['p99']:.0f} ms ({added:+.0f} ms for 300 ms at the provider)",
                flush=True,
            )
        if args.latency_only:
            return

        # Brownout: twice as many checkouts as threads, each waiting 5 s on the provider.
        shop.faults(api_latency_seconds=5.0)
        holders = 2 * processes * threads
        stop = threading.Event()
        catalog_lat: list[float] = []
        catalog_5xx = [0]

        def hold_checkouts(rng: random.Random):
            # Shoppers arrive over the first 5 s, not in one instant, and one sent to "Pay now"
            # comes back after 2.5 to 7.5 s: in lockstep, every slot's timeout fell in the same
            # instant and the next wave queued behind it, which measures the bench's rhythm.
            # --lockstep keeps the old rhythm, the worst case: every shopper at once, back after 5 s.
            stop.wait(0 if args.lockstep else rng.uniform(0, 5.0))
            while not stop.is_set():
                b = Browser(shop.web_port)
                b.open_catalog()
                b.fill_cart([variant])
                if checkout(b) != "pay":
                    stop.wait(5.0 if args.lockstep else rng.uniform(2.5, 7.5))

        outcomes.update({"pay": 0, "later": 0, "5xx": 0})
        workers = [
            threading.Thread(target=hold_checkouts, args=(random.Random(i),), daemon=True) for i in range(holders)
        ]
        for w in workers:
            w.start()
        time.sleep(10)  # all of them arrived, and the first calls timed out
        busy0, web0, bench0 = machine_busy(), shop.web_cpu(), time.process_time()
        catalog_lat, catalog_5xx[0] = browse_in_own_process(shop.web_port, args.brownout_seconds)
        busy, web, bench = machine_busy() - busy0, shop.web_cpu() - web0, time.process_time() - bench0
        stop.set()
        cat = summarize("catalog", args.brownout_seconds, catalog_lat)
        cores = os.cpu_count() or 1
        print(
            f"{'':<14} the machine's {cores} cores were {busy / (args.brownout_seconds * cores):.0%} busy: "
            f"the web {web / args.brownout_seconds:.2f} cores, this bench's checkout clients "
            f"{bench / args.brownout_seconds:.2f} cores",
            flush=True,
        )
        print(
            f"{'':<14} during the brownout with {holders} checkout clients: {catalog_5xx[0]} catalog 5xx, "
            f"checkouts {outcomes} (target p99 <= 100 ms, no 5xx) -> "
            f"{'MET' if cat['p99'] <= 100 and catalog_5xx[0] == 0 and outcomes['5xx'] == 0 else 'MISSED'}",
            flush=True,
        )
        shop.faults(api_latency_seconds=0)
        for w in workers:
            w.join(timeout=30)

        # Breaker open: the default threshold, the provider failing.
        shop.start_web(
            BACKSTOP_STRIPE_BREAKER_COOLDOWN_SECONDS="5",
            STRIPE_RATE_LIMIT_PER_SECOND="30",
            STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND="10000",
        )
        shop.faults(api_unavailable=True)
        run_clients(4, prepared(12), checkout)  # past the threshold
        outcomes.update({"pay": 0, "later": 0, "5xx": 0})
        calls0 = len(shop.call_times(0))
        carts = prepared(args.orders)
        cpu0 = shop.web_cpu()
        wall, lat = run_clients(8, carts, checkout)
        open_row = summarize("breaker open", wall, lat)
        open_cpu = (shop.web_cpu() - cpu0) / len(lat) * 1000
        made = len(shop.call_times(0)) - calls0
        print(
            f"{'':<14} {outcomes['later']} pay-later, {made} provider calls (target p99 <= 200 ms) -> "
            f"{'MET' if open_row['p99'] <= 200 else 'MISSED'}; web CPU {open_cpu:.2f} ms/order",
            flush=True,
        )

        # Overload: a budget of 30/s and 64 clients checking out as fast as they can.
        shop.faults(api_unavailable=False)
        time.sleep(2.0)  # the breaker's probe finds the provider back within about a second
        outcomes.update({"pay": 0, "later": 0, "5xx": 0})
        carts = prepared(args.orders)
        since = time.time()
        wall, lat = run_clients(64, carts, checkout)
        peak = peak_in_window(shop.call_times(since), 1.0)
        summarize("overload", wall, lat)
        print(
            f"{'':<14} peak {peak} provider calls in one second at the sandbox, budget 30 (target <= budget) -> "
            f"{'MET' if peak <= 30 else 'MISSED'}; checkouts {outcomes}",
            flush=True,
        )
        if fast is not None:
            print(
                f"web CPU per order: {fast['cpu_ms']:.2f} ms with the provider call, {open_cpu:.2f} ms without "
                f"(x{fast['cpu_ms'] / open_cpu:.2f})",
                flush=True,
            )
    finally:
        shop.stop()
        drop()
        forget_redis(args.redis, shop.prefix)


if __name__ == "__main__":
    main()
