"""The provider watch: the payment provider checked every CHECK_INTERVAL_SECONDS whether or not
any customer is paying, so the console's provider card says what is true now.

Why: the breaker (provider.guard) learns only from calls the shop makes. With no customer, a
provider that went down looked reachable for as long as nobody paid, and one that came back
looked down until somebody did. The watch makes the probe's cheap read (`probe.check`) on a
clock, keeps its outcome beside the breaker (`Breaker.note_check`: when, whether it answered, in
words), and feeds the breaker as a call would: failures in a row open it, an answer closes it and
wakes the work that waited (as the prober's success does). One check per interval across the
shop (a claim in Redis), run by a thread beside each scheduler (`flask shop scheduler`, `flask
shop up`); with the check's own timeout (probe.PROBE_TIMEOUT_SECONDS) a change either way shows
within CHECK_INTERVAL_SECONDS + that timeout, under 5 s.

Every DELIVERY_CHECK_SECONDS it also asks the provider which recent events it has not managed
to deliver (`check_deliveries`): a wrong signing secret makes the provider's own deliveries look
like a scanner's at the shop's door, but not in the provider's view.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from flask import current_app

from ..domain.deadlines import utcnow
from . import gateway, guard, probe
from .transport import quiet_calls

log = logging.getLogger("shop.payments.watch")

CHECK_INTERVAL_SECONDS = 2.0
# The provider's view of its webhook deliveries: asked every minute, about the last hour.
DELIVERY_CHECK_SECONDS = 60
DELIVERY_WINDOW = timedelta(hours=1)
DELIVERIES_KEY = "deliveries"
# The card is not green on a check older than this (the watch has stopped: no scheduler runs).
STALE_AFTER_SECONDS = 15


def check_now() -> bool | None:
    """One check of the provider, recorded for the card and fed to the breaker. True: it
    answered; False: it failed; None: no slot or budget to ask now (nothing recorded)."""
    provider_guard = guard.get()
    before = provider_guard.breaker_view().get("check_ok")
    with quiet_calls():  # a line every 2 s per scheduler would drown the log: only changes are said
        answered, words = probe.check()
    if answered is None:
        return None
    if answered is False and before is not False:
        log.warning("payment provider did not answer the watch's check: %s", words)
    provider_guard.breaker.note_check(answered, words)
    view = provider_guard.breaker_view()
    if answered:
        if view["state"] != guard.CLOSED:
            if provider_guard.probe_result(True) is guard.CLOSED:
                log.warning("payment provider answers again (the watch's check): the breaker is closed")
                probe.recovered()
        elif view.get("failures"):
            provider_guard.record(ok=True)
    elif view["state"] == guard.CLOSED:
        provider_guard.record(ok=False)
    return answered


def check_deliveries(now: datetime | None = None) -> dict | None:
    """Ask the provider which of its recent events it has not delivered to the shop
    (`gateway.undelivered_events`, the last DELIVERY_WINDOW) and keep the answer for the
    webhook card, minus those the shop has since received and applied (a receipt `accepted` or
    `duplicate` for that event id). None when the provider could not be asked (nothing kept)."""
    from sqlalchemy import select

    from ..extensions import db
    from ..models import ReceiptOutcome, WebhookReceipt

    now = now or utcnow()
    try:
        with quiet_calls():
            events = gateway.undelivered_events(since=now - DELIVERY_WINDOW)
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        log.info("provider watch: could not ask for undelivered events: %s", exc)
        return None
    ids = [e[0] for e in events]
    received = set()
    if ids:
        received = set(
            db.session.execute(
                select(WebhookReceipt.event_id).where(
                    WebhookReceipt.event_id.in_(ids),
                    WebhookReceipt.outcome.in_((ReceiptOutcome.ACCEPTED, ReceiptOutcome.DUPLICATE)),
                )
            ).scalars()
        )
        db.session.rollback()
    missing = [e for e in events if e[0] not in received]
    view = {
        "checked_at": now.timestamp(),
        "count": len(missing),
        "latest_id": missing[0][0] if missing else "",
        "latest_type": missing[0][1] if missing else "",
        "latest_created": missing[0][2] if missing else 0,
    }
    _store(DELIVERIES_KEY, view)
    return view


def deliveries_view() -> dict | None:
    """The last `check_deliveries` answer, as kept (None when none was kept)."""
    raw = _load(DELIVERIES_KEY)
    if not raw or not raw.get("checked_at"):
        return None
    return {
        "checked_at": float(raw["checked_at"]),
        "count": int(raw.get("count") or 0),
        "latest_id": raw.get("latest_id") or None,
        "latest_type": raw.get("latest_type") or None,
        "latest_created": int(float(raw.get("latest_created") or 0)) or None,
    }


_LOCAL: dict[str, dict] = {}  # this process's copy while Redis is away


def _key(name: str) -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:provider:{name}"


def _store(name: str, mapping: dict) -> None:
    from redis.exceptions import RedisError

    _LOCAL[_key(name)] = {k: str(v) for k, v in mapping.items()}
    try:
        conn = guard.get().shared.connection()
        if conn is not None:
            conn.hset(_key(name), mapping={k: str(v) for k, v in mapping.items()})
    except RedisError as exc:
        guard.get().shared.unreachable(exc)


def _load(name: str) -> dict | None:
    from redis.exceptions import RedisError

    try:
        conn = guard.get().shared.connection()
        if conn is not None:
            raw = conn.hgetall(_key(name))
            return {
                (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in raw.items()
            }
    except RedisError:
        pass
    return _LOCAL.get(_key(name))


def _claim(interval: float, name: str = "watch") -> bool:
    """This process's turn to check (at most one check per interval across every scheduler);
    True while Redis is away, so each process then checks for itself."""
    from redis.exceptions import RedisError

    shared = guard.get().shared
    try:
        conn = shared.connection()
        if conn is None:
            return True
        return bool(conn.set(_key(name), "1", nx=True, px=int(interval * 1000) - 50))
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
                    if _claim(DELIVERY_CHECK_SECONDS, "deliveries-watch"):
                        check_deliveries()
                except Exception:  # noqa: BLE001 - the watch must outlive any one bad round
                    log.exception("provider watch: a check failed; checking again")
                finally:
                    from ..extensions import db

                    db.session.remove()
                stop.wait(max(0.05, interval - (time.monotonic() - started)))

    threading.Thread(target=run, name="provider-watch", daemon=True).start()
    return stop
