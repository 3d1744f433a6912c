"""The provider watch: the payment provider checked every CHECK_INTERVAL_SECONDS whether or not
any customer is paying, so the console's provider card says what is true now.

Why: the breaker (payments.guard) learns only from calls the shop makes. With no customer, a
provider that went down looked reachable for as long as nobody paid, and one that came back
looked down until somebody did. The watch makes the probe's cheap read (`gateway.check`) on a
clock, keeps its outcome beside the breaker (`Breaker.note_check`: when, whether it answered, in
words), and feeds the breaker as a call would: failures in a row open it, an answer closes it and
wakes the work that waited (as the prober's success does). One check per interval across the
shop (a claim in Redis), run by a thread beside each scheduler (`flask shop scheduler`, `flask
shop up`); with the check's own timeout (gateway.PROBE_TIMEOUT_SECONDS) a change either way shows
within CHECK_INTERVAL_SECONDS + that timeout, under 5 s.
"""

from __future__ import annotations

import logging
import threading
import time

from flask import current_app

from . import gateway, guard

log = logging.getLogger("shop.payments.watch")

CHECK_INTERVAL_SECONDS = 2.0
# The card is not green on a check older than this (the watch has stopped: no scheduler runs).
STALE_AFTER_SECONDS = 15


def check_now() -> bool | None:
    """One check of the provider, recorded for the card and fed to the breaker. True: it
    answered; False: it failed; None: no slot or budget to ask now (nothing recorded)."""
    provider_guard = guard.get()
    answered, words = gateway.check()
    if answered is None:
        return None
    provider_guard.breaker.note_check(answered, words)
    view = provider_guard.breaker_view()
    if answered:
        if view["state"] != guard.CLOSED:
            if provider_guard.probe_result(True) is guard.CLOSED:
                log.warning("payment provider answers again (the watch's check): the breaker is closed")
                gateway._recovered()
        elif view.get("failures"):
            provider_guard.record(ok=True)
    elif view["state"] == guard.CLOSED:
        provider_guard.record(ok=False)
    return answered


def _claim(interval: float) -> bool:
    """This process's turn to check (at most one check per interval across every scheduler);
    True while Redis is away, so each process then checks for itself."""
    from redis.exceptions import RedisError

    shared = guard.get().shared
    try:
        conn = shared.connection()
        if conn is None:
            return True
        key = f"{current_app.config['QUEUE_PREFIX']}:provider:watch"
        return bool(conn.set(key, "1", nx=True, px=int(interval * 1000) - 50))
    except RedisError:
        return True


def watch_in_background(app, interval: float = CHECK_INTERVAL_SECONDS) -> threading.Event:
    """Start the watch thread; set the returned event to stop it."""
    stop = threading.Event()

    def run() -> None:
        with app.app_context():
            while not stop.is_set():
                started = time.monotonic()
                try:
                    if _claim(interval):
                        check_now()
                except Exception:  # noqa: BLE001 - the watch must outlive any one bad round
                    log.exception("provider watch: a check failed; checking again")
                finally:
                    from ..extensions import db

                    db.session.remove()
                stop.wait(max(0.05, interval - (time.monotonic() - started)))

    threading.Thread(target=run, name="provider-watch", daemon=True).start()
    return stop
