"""Retention under load: prune millions of done rows while checkout runs at half its capacity.

PostgreSQL only (SKIP LOCKED, relation sizes). Creates its own database on the server (dropped at
the end) and its own Redis key prefix, so it touches nothing else.

    python bench/retention.py [--rows 1000000] [--seconds 20] [--rounds 2]
    python bench/retention.py --rows 10000000          # the issue's figure (the prune alone: about an hour)
    python bench/retention.py --rows 10000000 --try batch=500,rate=3000 --try batch=100,rate=1000
                                                       # pacing settings side by side, each for --seconds

`--try` (repeatable) compares the prune's pacing (PRUNE_BATCH_SIZE, PRUNE_ROWS_PER_SECOND,
PRUNE_PAUSE_SECONDS) on one generated backlog, instead of the full prune and the rounds: for each,
`--pairs` times a window of `--seconds` without pruning then one while a prune process with those
settings runs (stopped after it: a window removes a small part of the backlog, so every try meets
nearly the same tables). It prints each pair's p99s and WAL, and the ratio of the p99 of all the
pruning windows' checkouts to that of all the quiet ones' (alternating windows, so that a shared
machine's drifting load falls on both sides).

1. Generates `--rows` finished rows 60 days old with INSERT ... SELECT generate_series, as months
   of a busy shop leave them: paid orders (one per 10 rows) with two events each, and per order
   6 done deliveries, 2 obsolete or done commands and 2 webhook receipts. Prints row counts and
   pg_total_relation_size of each table. A delivery's `completed_at` (the age the prune walks)
   grows with its place in the table, as in a shop's own tables, where rows are appended as
   orders are placed and finished seconds later: the prune's oldest-first walk then meets the
   rows page by page. (Until 2026-12-03 the generator spread the ages as `g % 1000` ms, so
   consecutive rows of the walk sat on pages far apart and every deleted row dirtied a page of
   its own: 1 KiB of WAL per row instead of a few hundred bytes, a cost no real table has.)
2. Checkout's capacity: real orders through place_order (the checkout use case, in-process, one
   client, back to back) for a few seconds.
3. Checkout at half that rate, paced, for `--seconds`, without pruning: p50/p99 of place_order.
4. The same while `flask shop prune` (a real process, as an operator or the periodic job runs it)
   removes the rows: p50/p99 again, the ratio of the two p99s (target <= 1.2), and the prune's
   own rate. Checkout keeps running until the prune ends (or for `--seconds` more at most when
   `--seconds` is shorter than the prune: the ratio is measured while it runs).
5. VACUUM (what autovacuum does after a mass delete: the space becomes reusable, files do not
   shrink) and the counts and sizes again.
6. Steady state (`--rounds` > 1): each round another retention window's worth of rows arrives
   (generated again) and the prune removes it; the sizes before and after each round's prune.
   Flat: each round's peak and floor match round 1's, the freed space reused instead of the
   tables growing by a round's worth each time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from scratchdb import make_database, seed_bench_variant  # noqa: E402  (bench/scratchdb.py)
from sqlalchemy import insert, text  # noqa: E402

# Every simulated customer is a fresh browser and address, but lift the hoarding limits anyway
# (docs/REFERENCE.md, Settings), as the other load benches do.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

FLASK = os.path.join(os.path.dirname(sys.executable), "flask")
TABLES = (
    "outbox_deliveries",
    "scheduled_commands",
    "webhook_receipts",
    "outbox_events",
    "orders",
    "pruned_order_details",
)
# An order of the generated past every 10 rows: 6 deliveries, 2 commands, 2 receipts; 2 events.
DELIVERIES, COMMANDS, RECEIPTS, EVENTS = 6, 2, 2, 2


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = max(0, min(len(values) - 1, int(round(p / 100 * (len(values) - 1)))))
    return values[k]


def generate_past(conn, rows: int, round_no: int) -> int:
    """`rows` finished rows (deliveries, commands, receipts) of paid orders, 60 days old, plus
    those orders and their events, in set-based statements (one per table)."""
    orders = max(1, rows // (DELIVERIES + COMMANDS + RECEIPTS))
    tag = f"{round_no:x}"
    o0 = conn.execute(text("SELECT coalesce(max(id), 0) FROM orders")).scalar_one()
    e0 = conn.execute(text("SELECT coalesce(max(id), 0) FROM outbox_events")).scalar_one()
    conn.execute(
        text(
            """
            INSERT INTO orders (id, reference, access_token, browser_id, email, status, total, currency,
                                inventory_restored, payment_attempts, version, created_at, updated_at)
            SELECT :o0 + g, 'BK-' || upper(lpad(to_hex(:o0 + g), 8, '0')), 'bench', 'past-' || :tag, 'past@example.com',
                   'Paid', 100, 'usd', false, 1, 3, now() - interval '61 days', now() - interval '60 days'
            FROM generate_series(1, :n) AS g
            """
        ),
        {"o0": o0, "n": orders, "tag": tag},
    )
    conn.execute(text("SELECT setval(pg_get_serial_sequence('orders', 'id'), (SELECT max(id) FROM orders))"))
    conn.execute(
        text(
            """
            INSERT INTO outbox_events (id, order_id, name, payload, created_at)
            SELECT :e0 + g, :o0 + (g - 1) / :per + 1,
                   CASE WHEN g % 2 = 1 THEN 'OrderPlaced' ELSE 'OrderPaid' END,
                   '{"bench": true}'::json, now() - interval '60 days'
            FROM generate_series(1, :n) AS g
            """
        ),
        {"e0": e0, "o0": o0, "per": EVENTS, "n": orders * EVENTS},
    )
    conn.execute(
        text("SELECT setval(pg_get_serial_sequence('outbox_events', 'id'), (SELECT max(id) FROM outbox_events))")
    )
    # Three handlers per event: 6 deliveries per order.
    conn.execute(
        text(
            """
            INSERT INTO outbox_deliveries (event_id, handler, order_id, status, attempts, max_attempts,
                                           next_attempt_at, provider_waits, created_at, updated_at, completed_at)
            SELECT :e0 + (g - 1) / 3 + 1, 'bench_handler_' || ((g - 1) % 3), :o0 + (g - 1) / :per + 1, 'done', 1, 5,
                   now() - interval '60 days', 0, now() - interval '60 days', now() - interval '60 days',
                   now() - interval '61 days' + g * interval '1 millisecond'
            FROM generate_series(1, :n) AS g
            """
        ),
        {"e0": e0, "o0": o0, "per": DELIVERIES, "n": orders * DELIVERIES},
    )
    conn.execute(
        text(
            """
            INSERT INTO scheduled_commands (kind, order_id, payload, status, attempts, max_attempts, next_attempt_at,
                                            provider_waits, discard_reason, created_at, updated_at, completed_at)
            SELECT CASE WHEN g % 2 = 1 THEN 'expire_unpaid_order' ELSE 'send_email' END,
                   :o0 + (g - 1) / :per + 1, '{}'::json,
                   CASE WHEN g % 2 = 1 THEN 'obsolete' ELSE 'done' END, 1, 5, now() - interval '60 days', 0,
                   CASE WHEN g % 2 = 1 THEN 'obsolete: the order was paid before its deadline' END,
                   now() - interval '60 days', now() - interval '60 days', now() - interval '60 days'
            FROM generate_series(1, :n) AS g
            """
        ),
        {"o0": o0, "per": COMMANDS, "n": orders * COMMANDS},
    )
    conn.execute(
        text(
            """
            INSERT INTO webhook_receipts (event_id, event_type, outcome, reason, order_id, http_status, received_at)
            SELECT 'evt_' || :tag || '_' || g, 'checkout.session.completed', 'accepted', '', :o0 + (g - 1) / :per + 1,
                   200, now() - interval '60 days'
            FROM generate_series(1, :n) AS g
            """
        ),
        {"tag": tag, "o0": o0, "per": RECEIPTS, "n": orders * RECEIPTS},
    )
    return orders * (DELIVERIES + COMMANDS + RECEIPTS)


def sizes(engine) -> dict[str, tuple[int, int, int]]:
    """Per table: (rows, pg_total_relation_size, of which indexes)."""
    with engine.connect() as conn:
        out = {}
        for table in TABLES:
            n = conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            total, indexes = conn.execute(
                text("SELECT pg_total_relation_size(:t), pg_indexes_size(:t)"), {"t": table}
            ).one()
            out[table] = (n, total, indexes)
        return out


def print_sizes(label: str, figures: dict[str, tuple[int, int, int]]) -> None:
    print(f"{label}:", flush=True)
    for table, (n, total, indexes) in figures.items():
        print(
            f"  {table:<22} {n:>11,} rows {total / 2**20:>9.1f} MiB in all "
            f"(pg_total_relation_size; indexes {indexes / 2**20:.1f} MiB)",
            flush=True,
        )


class Checkout:
    """Real checkouts in this process: a fresh browser's cart of one unit, then place_order,
    timed alone (the cart is the customer's earlier requests)."""

    def __init__(self, db, variant_id: int):
        self.db, self.variant_id = db, variant_id

    def one(self) -> float:
        from shop.models import Cart, CartItem
        from shop.orders.checkout import place_order

        db = self.db
        browser = uuid.uuid4().hex
        cart = Cart(browser_id=browser, status="open")
        db.session.add(cart)
        db.session.flush()
        db.session.execute(insert(CartItem).values(cart_id=cart.id, variant_id=self.variant_id, quantity=1))
        cart_id = cart.id
        db.session.commit()
        started = time.perf_counter()
        placed = place_order(cart_id=cart_id, browser_id=browser, email=f"bench-{browser[:12]}@example.com")
        took = time.perf_counter() - started
        assert placed.ok, placed
        db.session.remove()
        return took

    def capacity(self, seconds: float) -> float:
        end, n = time.perf_counter() + seconds, 0
        started = time.perf_counter()
        while time.perf_counter() < end:
            self.one()
            n += 1
        return n / (time.perf_counter() - started)

    def paced(self, rate: float, seconds: float, until=None) -> list[float]:
        """place_order latencies at `rate` per second for `seconds` (or until `until()` is true)."""
        latencies, start, i = [], time.perf_counter(), 0
        while time.perf_counter() - start < seconds and not (until and until()):
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            latencies.append(self.one())
            i += 1
        return latencies


TRY_KEYS = {"batch": "PRUNE_BATCH_SIZE", "rate": "PRUNE_ROWS_PER_SECOND", "pause": "PRUNE_PAUSE_SECONDS"}


def parse_try(spec: str) -> dict:
    """`batch=500,rate=3000,pause=0.05` -> the app's PRUNE_* settings."""
    out = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in TRY_KEYS:
            raise argparse.ArgumentTypeError(f"--try: {key!r} is not one of {', '.join(TRY_KEYS)}")
        out[TRY_KEYS[key.strip()]] = float(value) if key.strip() == "pause" else int(value)
    return out


def prune_child(config_json: str) -> None:
    """`--prune-child CONFIG`: the prune of `flask shop prune` in a process of its own, with the
    given PRUNE_* settings, until it is done or sent SIGTERM (then it ends after its batch)."""
    import json
    import signal

    from shop import create_app
    from shop.scheduling import retention

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    app = create_app(json.loads(config_json))
    # Started before the window it is measured in, as a long-running worker would be: Python's
    # start and the app's are not part of the prune's cost.
    print("ready", flush=True)
    sys.stdin.readline()
    with app.app_context():
        result = retention.prune(should_stop=stop.is_set, progress=lambda line: print(f"  {line}", flush=True))
    for line in result.report_lines():
        print(line, flush=True)


def run_prune(env: dict, config: dict | None = None) -> tuple[subprocess.Popen, list[str]]:
    import json

    lines: list[str] = []
    command = [FLASK, "--app", "app", "shop", "prune"]
    if config is not None:
        command = [sys.executable, os.path.abspath(__file__), "--prune-child", json.dumps(config)]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE if config is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def read():
        for line in process.stdout:
            lines.append(line.rstrip())

    threading.Thread(target=read, daemon=True).start()
    if config is not None:
        while "ready" not in lines:
            if process.poll() is not None:
                raise SystemExit("the prune process ended before it was ready:\n" + "\n".join(lines))
            time.sleep(0.05)
        time.sleep(1)  # its start's last work (the GC, the log handlers) done before the window
        process.stdin.write("go\n")
        process.stdin.flush()
    return process, lines


def wal_lsn(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")).scalar_one()


def compare_pacings(
    engine, checkout: Checkout, rate: float, seconds: float, env: dict, tries: list[dict], pairs: int
) -> None:
    """Each pacing: `pairs` times a window without pruning then one with a prune process of those
    settings (started for the window, stopped after it); the p99 of all the quiet windows'
    checkouts together against that of all the pruning windows', so that the drift of a shared
    machine's load falls on both sides alike. Also p50, and the WAL written per window."""

    def window(config: dict | None) -> tuple[list[float], float, str]:
        lsn = wal_lsn(engine)
        process = lines = None
        if config is not None:
            process, lines = run_prune(env, config)
        latencies = checkout.paced(rate, seconds)
        if process is not None:
            process.terminate()
            process.wait()
        wal = (wal_lsn(engine) - lsn) / 2**20
        removed = ""
        if lines is not None:
            said = [line for line in lines if "removed so far" in line]
            removed = f", {said[-1].strip() if said else 'no progress line'}"
        return latencies, wal, removed

    for config in tries:
        name = ", ".join(f"{k}={v}" for k, v in config.items())
        print(f"pacing {name} ({pairs} pairs of {seconds:.0f} s windows):", flush=True)
        quiet_all, busy_all = [], []
        for pair in range(1, pairs + 1):
            quiet, quiet_wal, _ = window(None)
            busy, busy_wal, removed = window(config)
            quiet_all += quiet
            busy_all += busy
            print(
                f"  pair {pair}: p99 {percentile(quiet, 99) * 1000:.2f} ms without (WAL {quiet_wal:.1f} MiB), "
                f"{percentile(busy, 99) * 1000:.2f} ms while pruning (WAL {busy_wal:.1f} MiB{removed})",
                flush=True,
            )
        print(
            f"  all pairs: {len(quiet_all)} checkouts without pruning, p50 {percentile(quiet_all, 50) * 1000:.2f} ms, "
            f"p99 {percentile(quiet_all, 99) * 1000:.2f} ms; {len(busy_all)} while pruning, "
            f"p50 {percentile(busy_all, 50) * 1000:.2f} ms, p99 {percentile(busy_all, 99) * 1000:.2f} ms",
            flush=True,
        )
        print(
            f"  ratio of the p99s: {percentile(busy_all, 99) / percentile(quiet_all, 99):.2f}x (target <= 1.2)",
            flush=True,
        )


def vacuum(engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TABLES:
            conn.execute(text(f"VACUUM (ANALYZE) {table}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database",
        default=os.environ.get("BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11"))
    parser.add_argument("--rows", type=int, default=1_000_000, help="done rows to prune (10,000,000: the issue's)")
    parser.add_argument("--seconds", type=float, default=20.0, help="each checkout measurement window")
    parser.add_argument("--rounds", type=int, default=2, help="generate-and-prune rounds (2+: steady state)")
    parser.add_argument(
        "--try",
        dest="tries",
        action="append",
        type=parse_try,
        default=[],
        metavar="batch=N,rate=N,pause=S",
        help="compare prune pacings on one backlog (repeatable; see the module's text)",
    )
    parser.add_argument("--pairs", type=int, default=4, help="with --try: quiet and pruning windows per pacing")
    parser.add_argument("--prune-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prune_child:
        prune_child(args.prune_child)
        return
    if not args.database.startswith("postgresql"):
        parser.error("PostgreSQL only: --database postgresql+psycopg://...")

    database_url, drop = make_database(args.database, "retention")
    prefix = f"bench-retention-{uuid.uuid4().hex[:8]}"
    instance = f"/tmp/backstop-bench-{prefix}"
    os.environ["BACKSTOP_INSTANCE_PATH"] = instance
    from shop import create_app
    from shop.extensions import db

    app = create_app(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": args.redis,
            "SECRET_KEY": "bench",
            "QUEUE_PREFIX": prefix,
            "UNPAID_ORDER_EXPIRY_ENABLED": False,
        }
    )
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": args.redis,
        "SECRET_KEY": "bench",
        "BACKSTOP_QUEUE_PREFIX": prefix,
        "BACKSTOP_INSTANCE_PATH": instance,
    }
    ctx = app.app_context()
    ctx.push()
    try:
        from flask_migrate import upgrade

        upgrade()
        variant_id = seed_bench_variant(100_000_000)
        engine = db.engine
        started = time.perf_counter()
        with engine.begin() as conn:
            generated = generate_past(conn, args.rows, 1)
        vacuum(engine)
        print(f"generated {generated:,} done rows (60 days old) in {time.perf_counter() - started:.1f} s", flush=True)
        before = sizes(engine)
        print_sizes("before the prune", before)

        checkout = Checkout(db, variant_id)
        for _ in range(50):  # warm up: statement caches, the pool
            checkout.one()
        capacity = checkout.capacity(5)
        rate = capacity / 2
        print(f"checkout capacity (place_order, one client, back to back): {capacity:.0f}/s; offered: {rate:.0f}/s")

        if args.tries:
            compare_pacings(engine, checkout, rate, args.seconds, env, args.tries, args.pairs)
            return

        quiet = checkout.paced(rate, args.seconds)
        print(
            f"without pruning: {len(quiet)} checkouts, p50 {percentile(quiet, 50) * 1000:.2f} ms, "
            f"p99 {percentile(quiet, 99) * 1000:.2f} ms",
            flush=True,
        )

        prune_started = time.perf_counter()
        process, lines = run_prune(env)
        busy = checkout.paced(rate, args.seconds, until=lambda: process.poll() is not None)
        measured_for = time.perf_counter() - prune_started
        process.wait()
        prune_seconds = time.perf_counter() - prune_started
        print(
            f"while pruning: {len(busy)} checkouts in {measured_for:.1f} s, p50 {percentile(busy, 50) * 1000:.2f} ms, "
            f"p99 {percentile(busy, 99) * 1000:.2f} ms",
            flush=True,
        )
        # Once more without, after it: on a shared machine the load of others moves between
        # windows; the quieter of the two is the baseline (the stricter ratio).
        quiet_after = checkout.paced(rate, args.seconds)
        print(
            f"without pruning, after it: {len(quiet_after)} checkouts, "
            f"p50 {percentile(quiet_after, 50) * 1000:.2f} ms, "
            f"p99 {percentile(quiet_after, 99) * 1000:.2f} ms",
            flush=True,
        )
        baseline = min(percentile(quiet, 99), percentile(quiet_after, 99))
        ratio = percentile(busy, 99) / baseline
        print(
            f"checkout p99 while pruning / without: {ratio:.2f}x (target <= 1.2; "
            f"{percentile(busy, 99) / percentile(quiet, 99):.2f}x against the window before, "
            f"{percentile(busy, 99) / percentile(quiet_after, 99):.2f}x against the one after)"
        )
        progress = [line for line in lines if line.startswith("  ")]
        print(
            f"`flask shop prune` exited {process.returncode} after {prune_seconds:.1f} s; its output "
            f"({len(progress)} progress lines, the last shown):"
        )
        for line in [line for line in lines if not line.startswith("  ")] + progress[-1:]:
            print(f"  | {line}")
        # Every generated row is past its cutoff and owed nothing.
        print(f"prune rate: {generated / prune_seconds:,.0f} rows/s (alongside checkout until it ended)", flush=True)

        vacuum(engine)
        after = sizes(engine)
        print_sizes("after the prune and a VACUUM", after)

        # Steady state: each round, another retention window's worth of rows arrives (generated)
        # and the prune takes it away again. Flat: every round's peak and floor match round 1's.
        peaks, floors = {1: before}, {1: after}
        for round_no in range(2, args.rounds + 1):
            started = time.perf_counter()
            with engine.begin() as conn:
                generate_past(conn, args.rows, round_no)
            vacuum(engine)  # statistics for the new rows, as autovacuum's analyze would
            peaks[round_no] = sizes(engine)
            result = subprocess.run([FLASK, "--app", "app", "shop", "prune"], cwd=ROOT, env=env, capture_output=True)
            assert result.returncode == 0, result.stdout + result.stderr
            vacuum(engine)
            floors[round_no] = sizes(engine)
            took = time.perf_counter() - started
            print(f"round {round_no}: {generated:,} more rows generated, then pruned ({took:.1f} s)", flush=True)
        if args.rounds > 1:
            print("steady state, MiB in all (pg_total_relation_size) per round: before the prune -> after it, VACUUMed")
            for table in ("outbox_deliveries", "scheduled_commands", "webhook_receipts"):
                cells = ", ".join(
                    f"{peaks[r][table][1] / 2**20:.1f} -> {floors[r][table][1] / 2**20:.1f}" for r in sorted(peaks)
                )
                print(f"  {table:<20} {cells}")
    finally:
        db.session.remove()
        db.engine.dispose()
        ctx.pop()
        drop()


if __name__ == "__main__":
    main()
