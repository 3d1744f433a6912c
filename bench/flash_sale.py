"""A flash sale: N buyers check out one variant with S units at the same instant. Prints figures,
asserts nothing.

    python bench/flash_sale.py [--nodes 2] [--buyers 64,128,256] [--units-share 0.25]
                               [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

The nodes (tests/cluster_support.py: each the Procfile's web under gunicorn, a worker and a
scheduler in a host of its own, behind nginx, the Stripe sandbox as the provider with its budgets
lifted) serve N buyers, each a browser of its own over HTTP with the item already in its cart;
at one instant (a barrier) every buyer posts the checkout. Then the same N checkouts spread over
every variant of the catalog, each with plenty of stock: what one hot row costs.

For each N: the orders placed for the hot variant (must be exactly S = N x --units-share), the
answers (303 placed, 409 sold out, anything else, 5xx must be none), the latency of the placed
and of the sold-out answers (p50, p99, max: a sold-out buyer should be told at once), and the
ratio of the burst's throughput on one variant to the same burst spread (target at least 0.8).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from cluster_support import Cluster, from_address, why_no_cluster  # noqa: E402
from payment_helpers import Shopper  # noqa: E402

# Every buyer is its own browser and address, but all arrive from this machine: lift the
# per-client limits (docs/REFERENCE.md, Settings) for the shop processes the bench starts.
LIMITS = {
    "UNPAID_ORDERS_PER_CLIENT": "1000",
    "UNPAID_ORDERS_PER_ADDRESS": "100000",
    "STRIPE_RATE_LIMIT_PER_SECOND": "10000",
    "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND": "10000",
}
os.environ.update(LIMITS)
HOT = "MUG-350-SND"
ADDRESSES = itertools.count()
PLENTY = 1_000_000


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def burst(cluster: Cluster, picks: list[str]) -> tuple[float, list[tuple[int, float]]]:
    """Each buyer adds its pick to its cart, then all check out at once: (the burst's wall time,
    each answer's status and latency)."""
    skus = cluster.skus()
    # Each buyer a browser from an address of its own, never used before in the run: one address
    # for all would meet the front's per-address cart and checkout limits (429), not the row.
    shoppers = [Shopper.over_http(cluster.base_url, skus, session=from_address(next(ADDRESSES))) for _ in picks]
    for shopper, sku in zip(shoppers, picks, strict=True):
        assert shopper.add(sku).status_code == 303
    ready = threading.Barrier(len(picks) + 1)
    answers: list[tuple[int, float]] = [(0, 0.0)] * len(picks)

    def buy(i: int) -> None:
        ready.wait()
        t0 = time.monotonic()
        try:
            status = shoppers[i].checkout_cart().status_code
        except Exception:  # noqa: BLE001 - a connection the front dropped: counted as no answer
            status = 0
        answers[i] = (status, time.monotonic() - t0)

    threads = [threading.Thread(target=buy, args=(i,), daemon=True) for i in range(len(picks))]
    for t in threads:
        t.start()
    ready.wait()
    started = time.monotonic()
    for t in threads:
        t.join(120)
    return time.monotonic() - started, answers


def hot_orders(cluster: Cluster) -> int:
    with cluster.sql.connect() as conn:
        return conn.execute(
            text("SELECT count(DISTINCT order_id) FROM order_lines WHERE sku = :sku"), {"sku": HOT}
        ).scalar()


def one_size(cluster: Cluster, buyers: int, share: float) -> float:
    units = max(1, int(buyers * share))
    stock = {sku: PLENTY for sku in cluster.stock()}
    cluster.set_stock({**stock, HOT: units})
    before = hot_orders(cluster)
    hot_wall, hot = burst(cluster, [HOT] * buyers)
    placed = hot_orders(cluster) - before
    statuses = collections.Counter(status for status, _ in hot)
    sold = [s for status, s in hot if status == 303]
    out = [s for status, s in hot if status == 409]
    print(f"\n{buyers} buyers, {units} units of {HOT}: {placed} orders placed (exactly {units}: {placed == units})")
    failed = sum(n for s, n in statuses.items() if s >= 500 or s == 0)
    print(f"  answers {dict(sorted(statuses.items()))}; 5xx or none: {failed}")
    print(
        f"  placed    p50 {pct(sold, 0.5):.3f}s  p99 {pct(sold, 0.99):.3f}s  max {max(sold, default=float('nan')):.3f}s"
    )
    print(f"  sold out  p50 {pct(out, 0.5):.3f}s  p99 {pct(out, 0.99):.3f}s  max {max(out, default=float('nan')):.3f}s")
    variants = sorted(cluster.stock())
    cluster.set_stock({sku: PLENTY for sku in variants})
    spread_wall, spread = burst(cluster, [variants[i % len(variants)] for i in range(buyers)])
    spread_ok = sum(1 for status, _ in spread if status == 303)
    ratio = (buyers / hot_wall) / (buyers / spread_wall)
    print(
        f"  burst on one variant {hot_wall:.2f}s, spread over {len(variants)} variants {spread_wall:.2f}s "
        f"({spread_ok} placed): one variant answers at {ratio:.2f}x the spread's pace (target >= 0.8)"
    )
    return ratio


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2, choices=(1, 2))
    p.add_argument("--buyers", default="64,128,256", help="comma-separated burst sizes")
    p.add_argument("--units-share", type=float, default=0.25, help="units on sale per buyer")
    p.add_argument("--web-concurrency", type=int, default=2)
    # 2 nodes x 2 processes x (16 threads' pool + 10 overflow) stay within PostgreSQL's default
    # max_connections of 100 with the workers beside them; 32 does not, and the connections a
    # burst opens past the server's limit answer 503 (the shop warns of this at start).
    p.add_argument("--web-threads", type=int, default=16)
    p.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    )
    args = p.parse_args(argv)
    reason = why_no_cluster()
    if reason:
        print(f"flash_sale: cannot start nodes here: {reason}", file=sys.stderr)
        return 2
    nodes = ("node-a", "node-b")[: args.nodes]
    print(f"flash_sale: {os.cpu_count()} CPUs; {len(nodes)} node(s) of web {args.web_concurrency}x{args.web_threads}")
    with Cluster(
        nodes,
        web_concurrency=args.web_concurrency,
        web_threads=args.web_threads,
        server_url=args.database_url,
        env=LIMITS,
        label="flash",
        # No order expires during the bench: a cancelled order's restore would put units back
        # on sale in the middle of the next burst.
        window=3600,
    ) as cluster:
        # A burst first that is not measured: the fresh nodes open their database connections and
        # warm their code on it, which the first measured burst (the hot one) would pay alone.
        variants = sorted(cluster.stock())
        cluster.set_stock({sku: PLENTY for sku in variants})
        burst(cluster, [variants[i % len(variants)] for i in range(max(int(n) for n in args.buyers.split(",")))])
        ratios = [one_size(cluster, int(n), args.units_share) for n in args.buyers.split(",")]
    print(f"\nratios (one variant / spread): {', '.join(f'{r:.2f}' for r in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
