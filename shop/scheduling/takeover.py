"""Taking over a sweep cycle that was left behind: the scheduler's watch on the sweep's lease.

The periodic job runs a cycle every RECONCILIATION_INTERVAL_SECONDS (10 min). A holder killed
mid-cycle (its worker, or its whole machine) leaves the rest of the batch to the next one, and a
cycle skipped meanwhile does not come back. So every scheduler looks at the lease once a poll
(one primary-key read): a lease that lapsed (its heartbeat stopped: the holder died or froze,
here or elsewhere) or whose holder is a process of this machine that no longer exists gets a
cycle queued now (`queue.request_sweep_takeover`, at most one per two seconds for the whole
shop), whose worker takes the lease over. From the holder's death to the next cycle: at most
the lease (20 s) plus a poll plus a worker picking the job up."""

from __future__ import annotations

import logging
import threading

from .. import queue
from ..extensions import db
from .lease import abandoned_holder

log = logging.getLogger("shop.sweep")


def request_if_abandoned(sweep_seconds: int) -> str | None:
    """One look; queue a cycle when the lease was left behind. The holder it found, or None."""
    holder = abandoned_holder()
    if holder is not None and queue.request_sweep_takeover(sweep_seconds):
        log.warning("sweep: the lease of %s was left behind mid-cycle; a cycle is queued to take it over", holder)
    return holder


def watch_in_background(app, sweep_seconds: int) -> threading.Thread:
    """Run `request_if_abandoned` every SCHEDULER_POLL_SECONDS in a daemon thread of this process
    (the scheduler's), beside rq-scheduler's own loop. A failing look is logged; the next asks again."""
    every = app.config["SCHEDULER_POLL_SECONDS"]

    def loop() -> None:
        stop = threading.Event()
        with app.app_context():
            while not stop.wait(every):
                try:
                    request_if_abandoned(sweep_seconds)
                except Exception as exc:  # noqa: BLE001 - a database or Redis blip must not end the watch
                    log.warning("sweep: could not look at the sweep's lease this poll: %s", exc)
                finally:
                    db.session.remove()

    thread = threading.Thread(target=loop, name="sweep-lease-watch", daemon=True)
    thread.start()
    return thread
