"""What the worker does per cancelled order, counted rather than timed (not a test).

    /work/main/.venv/bin/python bench/calls.py [--orders 200]

Places and cancels `--orders` orders on a throwaway PostgreSQL database (as bench/compensation.py
does), then, in this process, drains their outbox deliveries (the stock restore and the e-mail
scheduling) and runs the e-mail commands, if any (a cancellation notice is now sent by its delivery
itself, so it is counted with the drain), and prints Python function calls (cProfile) and SQL
statements per cancelled order. Unlike rates and CPU times, these do not move with the load on a
shared machine: run it on two trees (PYTHONPATH=<tree>) to tell whether a change made the hot
path do more work (it is how an expanding IN in the store's guarded UPDATE was found).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compensation import Bench  # noqa: E402

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, default=200)
    ap.add_argument(
        "--database", default=os.environ.get("BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    )
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/12")
    args = ap.parse_args()

    bench = Bench(args.database, args.redis)
    try:
        from sqlalchemy import event, select

        from shop.extensions import db
        from shop.models import ScheduledCommand, WorkStatus
        from shop.outbox import dispatch

        for order_id, version in bench.place_orders(args.orders):
            bench.cancel(order_id, version)
        db.session.remove()
        statements = [0]

        def count(*_args, **_kwargs):
            statements[0] += 1

        event.listen(db.engine, "before_cursor_execute", count)

        profile = cProfile.Profile()
        profile.enable()
        while dispatch.drain_deliveries(batch_size=50, budget_seconds=60) != {"more": False}:
            pass
        profile.disable()
        db.session.remove()
        calls = pstats.Stats(profile).total_calls
        print(
            f"drain (restore + cancellation e-mail): {calls / args.orders:.0f} Python calls and "
            f"{statements[0] / args.orders:.2f} SQL statements per cancelled order",
            flush=True,
        )

        commands = (
            db.session.execute(select(ScheduledCommand.id).where(ScheduledCommand.status == WorkStatus.PENDING))
            .scalars()
            .all()
        )
        db.session.remove()
        if not commands:
            print("e-mail commands: none (each cancellation's e-mail went with its delivery, above)", flush=True)
            return
        dispatch.run_command(commands[0])  # the first one warms the mail templates
        statements[0] = 0
        profile = cProfile.Profile()
        profile.enable()
        for command_id in commands[1:]:
            dispatch.run_command(command_id)
        profile.disable()
        n = max(1, len(commands) - 1)
        print(
            f"e-mail commands: {pstats.Stats(profile).total_calls / n:.0f} Python calls and "
            f"{statements[0] / n:.2f} SQL statements per command",
            flush=True,
        )
    finally:
        bench.db.session.remove()
        bench.close()


if __name__ == "__main__":
    main()
