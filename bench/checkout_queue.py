"""The checkout queue, the provider's return after an outage, and the sweep's bulk path, against
the sandbox's real limits (not a test).

    .venv/bin/python bench/checkout_queue.py [--rate 100] [--seconds 30] [--limit 25] [--outage 5] [--bulk 1000]

Runs the Procfile's web line (gunicorn, threaded workers) and one `flask shop worker` (which
serves the payment queue) on a throwaway PostgreSQL database, with the Stripe sandbox as the
provider, and prints:

  queue     customers check out open-loop at --rate per second for --seconds while the sandbox
            limits creating Checkout Sessions to --limit per second (its
            api_endpoint_rate_limit_per_second fault, counted per endpoint as Stripe does) and the
            shop's STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND is set to the same; then it waits until
            nobody is in line. Prints the provider's 429s (target 0), the orders that reached the
            hosted page (target: all), the wait in line p50/p99 against what the budget implies
            for each order (the orders ahead of it when it joined / --limit; target: p99 within
            1.2x), the sessions per second while the line was served, and how far the line
            strayed from arrival order.
  recovery  the provider down for --outage seconds (api_unavailable) after checkouts opened the
            breaker, then back: how long until the breaker closed, and whether a checkout placed
            2 s after the provider's return lands on the hosted page (target: yes), --recoveries
            times.
  bulk      --bulk orders at the hosted page, paid at the provider with every webhook lost (the
            shop's endpoint is not registered), then one sweep cycle, in this process: the
            provider calls per settled order (target <= 1/20) against one retrieve per order.

Everything it started is stopped and the database dropped at the end.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkout import ROOT, Browser, _jobs, cpu_seconds, forget_redis, run_clients, seed  # noqa: E402
from provider import Shop, machine_busy, paced  # noqa: E402
from scratchdb import make_database  # noqa: E402

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

sys.path.insert(0, str(ROOT))

BIN = Path(sys.executable).parent
JSON_ACCEPT = "application/json"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def database_rows(database_url: str, sql: str, params: dict | None = None) -> list:
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql), params or {}).all()
    finally:
        engine.dispose()


def prepare(shop: Shop, variant: int, count: int, clients: int = 32) -> queue.Queue:
    """`count` browsers, each with the catalog open and one item in its cart."""
    ready: queue.Queue = queue.Queue()

    def make(_):
        b = Browser(shop.web_port)
        b.open_catalog()
        b.fill_cart([variant])
        ready.put(b)

    run_clients(clients, _jobs(count), make)
    return ready


def checkout(b: Browser) -> dict:
    sent = time.time()
    status, location, body = b.request(
        "POST", "/checkout", {"csrf_token": b.token, "email": "q@example.com"}, accept=JSON_ACCEPT
    )
    done = time.time()
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        data = {}
    kind = "5xx" if status >= 500 else "pay" if "/pay/" in location else "queued" if data.get("queued") else "later"
    return {"kind": kind, "reference": data.get("reference"), "sent": sent, "at": done, "status": status}


def queue_phase(shop: Shop, args, variant: int, database_url: str) -> None:
    total = int(args.rate * args.seconds)
    print(f"queue: preparing {total} shoppers...", flush=True)
    carts = prepare(shop, variant, total)
    shop.faults(api_endpoint_rate_limit_per_second=args.limit)
    since = time.time()
    cpu0 = cpu_split(shop)
    results: list[dict] = []
    lock = threading.Lock()

    def work(b: Browser):
        outcome = checkout(b)
        with lock:
            results.append(outcome)

    wall, latencies, late = paced(args.rate, carts, work, threads=256)
    kinds = {k: sum(1 for r in results if r["kind"] == k) for k in ("pay", "queued", "later", "5xx")}
    print(
        f"queue: offered {total} checkouts at {args.rate:g}/s in {wall:.1f} s ({late} sent late): "
        f"{kinds['pay']} straight to the payment page, {kinds['queued']} in line, {kinds['later']} pay-later, "
        f"{kinds['5xx']} 5xx; checkout p50 {pct(latencies, 0.5) * 1000:.0f} ms, p99 "
        f"{pct(latencies, 0.99) * 1000:.0f} ms",
        flush=True,
    )

    give_up = time.time() + kinds["queued"] / args.limit * 3 + 120
    while True:
        waiting = database_rows(database_url, "SELECT count(*) FROM orders WHERE payment_queued_at IS NOT NULL")[0][0]
        if not waiting or time.time() > give_up:
            break
        time.sleep(0.5)
    print_cpu(shop, cpu0, time.time() - since)
    refs = [r["reference"] for r in results if r["reference"]]
    rows = {
        ref: (status, updated.timestamp())
        for ref, status, updated in database_rows(
            database_url,
            "SELECT reference, status, updated_at FROM orders WHERE reference = ANY(:refs)",
            {"refs": refs},
        )
    }
    calls = shop.sandbox(f"/_sandbox/requests?since={since - 1!r}")["calls"]
    creates = [c for c in calls if c["endpoint"] == "POST /v1/checkout/sessions"]
    refused = sum(1 for c in calls if c["status"] == 429)
    if refused:
        served_at = sorted(c["at"] for c in creates if c["status"] == 200)
        for c in (c for c in calls if c["status"] == 429):
            before = bisect.bisect_left(served_at, c["at"]) - bisect.bisect_left(served_at, c["at"] - 1.0)
            print(
                f"queue: a 429 at {c['at'] - since:.2f} s ({c['endpoint']}), after {before} sessions created "
                f"in the second before it",
                flush=True,
            )
    at_page = sum(1 for status, _ in rows.values() if status == "PaymentInitiated")
    print(
        f"queue: provider 429s {refused} (target 0) -> {'MET' if refused == 0 else 'MISSED'}; "
        f"{at_page} of {len(rows)} orders at the hosted page, {waiting} still in line "
        f"(target: all at the page) -> {'MET' if at_page == len(rows) and not waiting else 'MISSED'}; "
        f"{len(creates)} session creates at the sandbox",
        flush=True,
    )

    queued = sorted((r for r in results if r["kind"] == "queued" and r["reference"] in rows), key=lambda r: r["at"])
    if not queued:
        print("queue: nobody waited in line (offer more than the budget)", flush=True)
        return
    joins = [r["at"] for r in queued]
    served = sorted(rows[r["reference"]][1] for r in queued)
    waits, implied = [], []
    for rank, r in enumerate(queued):
        ahead = rank - bisect.bisect_right(served, r["at"])  # joined before it, not yet served then
        waits.append(rows[r["reference"]][1] - r["at"])
        implied.append(max(0, ahead) / args.limit)
    ratio = pct(waits, 0.99) / pct(implied, 0.99) if pct(implied, 0.99) > 0 else float("nan")
    span = served[-1] - joins[0]
    print(
        f"queue: wait in line p50 {pct(waits, 0.5):.1f} s, p99 {pct(waits, 0.99):.1f} s; the budget implies "
        f"p50 {pct(implied, 0.5):.1f} s, p99 {pct(implied, 0.99):.1f} s (orders ahead / {args.limit}/s): "
        f"x{ratio:.2f} (target <= 1.2) -> {'MET' if ratio <= 1.2 else 'MISSED'}",
        flush=True,
    )
    # The line's order is the customers' (each one's click: when its checkout was sent).
    clicked = sorted(queued, key=lambda r: r["sent"])
    overtaken = sum(
        1 for a, b in zip(clicked, clicked[1:], strict=False) if rows[b["reference"]][1] < rows[a["reference"]][1] - 0.5
    )
    print(
        f"queue: {len(queued)} sessions for the line in {span:.1f} s from the first to join to the last "
        f"served ({len(queued) / span:.1f}/s against a budget of {args.limit}/s); {overtaken} of "
        f"{len(queued) - 1} customers served more than 0.5 s before the one who clicked just before them",
        flush=True,
    )
    shop.faults(api_endpoint_rate_limit_per_second=0)


def cpu_split(shop: Shop) -> dict:
    """CPU seconds so far: the web's workers, the worker, the sandbox, this bench, the machine."""
    return {
        "web": shop.web_cpu(),
        "worker": cpu_seconds([shop.worker.pid]),
        "sandbox": cpu_seconds([shop.sandbox_pid]),
        "bench": time.process_time(),
        "machine": machine_busy(),
    }


def print_cpu(shop: Shop, before: dict, wall: float) -> None:
    used = {k: v - before[k] for k, v in cpu_split(shop).items()}
    cores = os.cpu_count() or 1
    print(
        f"queue: CPU over the {wall:.0f} s of the phase, in cores: web {used['web'] / wall:.2f}, worker "
        f"{used['worker'] / wall:.2f}, sandbox {used['sandbox'] / wall:.2f}, this bench {used['bench'] / wall:.2f}; "
        f"the machine's {cores} cores {used['machine'] / (wall * cores):.0%} busy",
        flush=True,
    )


def breaker_state(redis_url: str, prefix: str) -> str:
    from redis import Redis

    r = Redis.from_url(redis_url)
    try:
        return (r.hget(f"{prefix}:provider:breaker", "state") or b"closed").decode()
    finally:
        r.close()


def recovery_phase(shop: Shop, args, variant: int) -> None:
    results = []
    for round_ in range(args.recoveries):
        shoppers = prepare(shop, variant, 12, clients=4)
        later = prepare(shop, variant, 1, clients=1).get_nowait()
        shop.faults(api_unavailable=True)
        down = time.time()
        while breaker_state(args.redis, shop.prefix) == "closed":
            if shoppers.empty() or time.time() - down > 20:
                raise SystemExit("recovery: the breaker did not open")
            checkout(shoppers.get_nowait())
        time.sleep(max(0.0, down + args.outage - time.time()))
        shop.faults(api_unavailable=False)
        back = time.time()
        closed = None
        while time.time() - back < 30:
            if breaker_state(args.redis, shop.prefix) == "closed":
                closed = time.time() - back
                break
            time.sleep(0.02)
        time.sleep(max(0.0, back + 2.0 - time.time()))
        outcome = checkout(later)
        results.append((closed, outcome["kind"]))
        print(
            f"recovery {round_ + 1}: outage {args.outage:g} s; breaker closed "
            f"{'never' if closed is None else f'{closed:.2f} s'} after the provider's return; a checkout "
            f"2 s after it -> {'the hosted page' if outcome['kind'] == 'pay' else outcome['kind']}",
            flush=True,
        )
        time.sleep(1.0)
    ok = all(c is not None and c <= 2.0 and k == "pay" for c, k in results)
    print(
        f"recovery: closed within 2 s and the checkout at +2 s reached the hosted page in "
        f"{sum(1 for c, k in results if c is not None and c <= 2.0 and k == 'pay')} of {len(results)} rounds -> "
        f"{'MET' if ok else 'MISSED'}",
        flush=True,
    )


def bulk_phase(shop: Shop, args, database_url: str) -> None:
    from sqlalchemy import select

    from shop import create_app
    from shop.domain.deadlines import utcnow
    from shop.extensions import db
    from shop.models import Cart, CartItem, InventoryItem, Order, Product, Variant
    from shop.orders.checkout import place_order
    from shop.payments.start import start_payment
    from shop.scheduling.sweep import run_cycle

    app = create_app(
        {
            "DATABASE_URL": database_url,
            "SECRET_KEY": "bench",
            "REDIS_URL": args.redis,
            "QUEUE_PREFIX": shop.prefix + "-bulk",
            "STRIPE_API_BASE": shop.env["STRIPE_API_BASE"],
            "STRIPE_SESSION_MIN_SECONDS": 60,
            "STRIPE_RATE_LIMIT_PER_SECOND": 10_000,
            "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND": 10_000,
        }
    )
    print(f"bulk: {args.bulk} orders at the hosted page, paid with no webhook...", flush=True)
    with app.app_context():
        product = Product(slug=f"bulk-{secrets.token_hex(3)}", name="Bulk", description="")
        db.session.add(product)
        db.session.flush()
        variant = Variant(
            product_id=product.id, sku=f"BULK-{secrets.token_hex(3)}", name="Bulk", price=700, currency="usd"
        )
        db.session.add(variant)
        db.session.flush()
        db.session.add(InventoryItem(variant_id=variant.id, on_hand=args.bulk * 2))
        db.session.commit()
        sessions = []
        for _ in range(args.bulk):
            cart = Cart(browser_id=secrets.token_hex(8), status="open")
            db.session.add(cart)
            db.session.flush()
            db.session.add(CartItem(cart_id=cart.id, variant_id=variant.id, quantity=1))
            db.session.commit()
            email = f"bulk-{cart.browser_id}@example.com"
            placed = place_order(cart_id=cart.id, browser_id=cart.browser_id, email=email)
            assert start_payment(placed.order_id, placed=placed).status == "started"
            sessions.append(placed.order_id)
        ids = sessions
        sids = [s for (s,) in db.session.execute(select(Order.payment_session_id).where(Order.id.in_(ids))).all()]
        db.session.rollback()
        for sid in sids:
            shop.sandbox(f"/_sandbox/sessions/{sid}/outcome", {"outcome": "paid"})
        since = time.time()
        started = time.perf_counter()
        result = run_cycle(now=utcnow() + timedelta(seconds=app.config["UNPAID_ORDER_EXPIRY_SECONDS"] + 60))
        took = time.perf_counter() - started
        calls = [c for c in shop.sandbox(f"/_sandbox/requests?since={since!r}")["calls"]]
        paid = db.session.execute(select(Order.id).where(Order.id.in_(ids), Order.status == "Paid")).all()
        db.session.remove()
        db.engine.dispose()
    per_order = len(calls) / max(1, len(paid))
    print(
        f"bulk: one sweep cycle settled {len(paid)} of {args.bulk} paid orders in {took:.1f} s with "
        f"{len(calls)} provider calls ({result.provider.get('event_pages', 0)} pages of events): "
        f"{per_order:.3f} calls per settled order (target <= 0.05) -> "
        f"{'MET' if len(paid) == args.bulk and per_order <= 0.05 else 'MISSED'}; one retrieve per order "
        f"would be {args.bulk} calls over {-(-args.bulk // app.config['RECONCILIATION_BATCH_SIZE'])} cycles",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="checkouts offered per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long they are offered")
    ap.add_argument("--limit", type=int, default=25, help="session creates per second the sandbox allows")
    ap.add_argument("--outage", type=float, default=5.0)
    ap.add_argument("--recoveries", type=int, default=3)
    ap.add_argument("--bulk", type=int, default=1000)
    ap.add_argument("--phases", default="queue,recovery,bulk")
    ap.add_argument(
        "--server", default=os.environ.get("BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    )
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    args = ap.parse_args()
    phases = set(args.phases.split(","))

    shop = Shop(args)
    shop.prefix = f"bench-queue-{shop.run_id}"
    database_url, drop = make_database(args.server, "queue")
    log_dir = Path(f"/tmp/backstop-bench-queue-{shop.run_id}")
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        variant = seed(database_url, 1_000_000_000)[0]
        sandbox = shop.boot(
            database_url,
            args.redis,
            str(log_dir),
            STRIPE_RATE_LIMIT_PER_SECOND="100",
            STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=str(args.limit),
        )
        with open(log_dir / "worker.log", "wb") as out:
            worker = subprocess.Popen(
                [str(BIN / "flask"), "--app", "app", "shop", "worker"],
                cwd=ROOT,
                env=shop.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        shop.procs.append(worker)
        shop.worker, shop.sandbox_pid = worker, sandbox.pid
        shop.start_web()
        print(
            f"web: {shop.env.get('WEB_CONCURRENCY', 'default')} x {shop.env.get('WEB_THREADS', 'default')} "
            f"threads, one worker serving the payment queue; logs in {log_dir}",
            flush=True,
        )
        if "queue" in phases:
            queue_phase(shop, args, variant, database_url)
        if "recovery" in phases:
            recovery_phase(shop, args, variant)
        if "bulk" in phases:
            bulk_phase(shop, args, database_url)
    finally:
        shop.stop()
        drop()
        forget_redis(args.redis, shop.prefix)


if __name__ == "__main__":
    main()
