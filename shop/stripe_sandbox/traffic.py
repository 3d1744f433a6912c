"""The /v1 traffic faults that act on time (latency, hang, rate limit) and the request log.

Both live outside `Sandbox.lock` on purpose: a call held back by latency or a hang must not
stop the hosted page, the control routes or other /v1 calls from being served, and counting a
request must not wait behind whatever /v1 call currently holds the state lock.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from typing import Any, Callable

# However the faults are set, no /v1 call is held longer than this: a test that forgets to
# switch `api_hang` off (or crashes first) leaves no server thread waiting forever.
MAX_API_HOLD_SECONDS = 120.0
RATE_WINDOW_SECONDS = 1.0
# The log keeps the most recent calls only; the per-route counts stay exact.
REQUEST_LOG_SIZE = 10_000


class ApiGate:
    """Holds /v1 calls back (latency, hang) and admits them under sliding 1-s rate limits: one
    for the whole account and one per endpoint (method + path template), as Stripe counts them.

    `faults` is read afresh each time a held call wakes, so switching a fault off, changing the
    latency, a reset (which replaces the faults) or closing the sandbox releases waiting calls
    at once; `wake()` must be called after any such change.
    """

    def __init__(self, faults: Callable[[], Any]):
        self._faults = faults
        self._changed = threading.Condition(threading.Lock())
        self._closed = False
        self._window_lock = threading.Lock()
        self._admitted: deque[float] = deque()  # monotonic times of admitted calls, last 1 s
        self._by_endpoint: dict[str, deque[float]] = {}

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def close(self) -> None:
        self._closed = True
        self.wake()

    def clear(self) -> None:
        with self._window_lock:
            self._admitted.clear()
            self._by_endpoint.clear()
        self.wake()

    def hold(self) -> None:
        """Wait out this call's latency (measured from its arrival) and any hang, capped."""
        arrived = time.monotonic()
        jitter_share = random.random()  # drawn once, so a changed jitter setting scales it
        latest = arrived + MAX_API_HOLD_SECONDS
        with self._changed:
            while not self._closed:
                faults = self._faults()
                if faults.api_hang:
                    until = latest
                else:
                    delay = faults.api_latency_seconds + jitter_share * faults.api_latency_jitter_seconds
                    until = min(latest, arrived + delay)
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(remaining)

    def refuse_next(self, faults) -> bool:
        """Count down `api_rate_limit_next_calls`: True while it had calls left to refuse."""
        with self._window_lock:
            if faults.api_rate_limit_next_calls <= 0:
                return False
            faults.api_rate_limit_next_calls -= 1
            return True

    def admit(self, limit: int, endpoint: str = "", endpoint_limit: int = 0) -> tuple[str, float] | None:
        """Count a call against the windows: None if it may proceed, else which limit refused it
        ("account" or "endpoint") and the seconds until it would have been admitted (for
        Retry-After).

        Only admitted calls occupy the windows, so at most `limit` calls are served in any one
        second however hard a client hammers, and at most `endpoint_limit` to any one endpoint;
        a refused call costs nothing. The windows are kept while the limits are off, so switching
        one on mid-traffic counts the last second honestly.
        """
        with self._window_lock:
            now = time.monotonic()
            window = self._by_endpoint.setdefault(endpoint, deque())
            for admitted in (self._admitted, window):
                while admitted and admitted[0] <= now - RATE_WINDOW_SECONDS:
                    admitted.popleft()
            if limit and len(self._admitted) >= limit:
                return "account", _slot_frees(self._admitted, limit, now)
            if endpoint_limit and len(window) >= endpoint_limit:
                return "endpoint", _slot_frees(window, endpoint_limit, now)
            self._admitted.append(now)
            window.append(now)
            return None


def _slot_frees(admitted: deque[float], limit: int, now: float) -> float:
    """When enough of the oldest admissions leave the window for one more call."""
    return admitted[len(admitted) - limit] + RATE_WINDOW_SECONDS - now


class RequestLog:
    """Every /v1 call since the last reset: exact counts per method and path, and the most
    recent calls with their arrival time, Idempotency-Key and final status."""

    def __init__(self, size: int = REQUEST_LOG_SIZE):
        self._lock = threading.Lock()
        self._size = size
        self.clear()

    def clear(self) -> None:
        with self._lock:
            self._calls: deque[dict] = deque(maxlen=self._size)
            self._counts: Counter = Counter()

    def record(self, method: str, path: str, idempotency_key: str | None, endpoint: str = "") -> dict:
        entry = {
            "method": method,
            "path": path,
            "endpoint": endpoint or f"{method} {path}",
            "at": time.time(),
            "idempotency_key": idempotency_key,
            "status": None,  # set when the answer is sent; None while the call is held
        }
        with self._lock:
            self._calls.append(entry)
            self._counts[(method, path)] += 1
        return entry

    def finish(self, entry: dict, status: int) -> None:
        with self._lock:
            entry["status"] = status

    def counts(self) -> list[dict]:
        with self._lock:
            return [{"method": m, "path": p, "count": n} for (m, p), n in sorted(self._counts.items())]

    def calls(self, since: float | None = None) -> list[dict]:
        """Oldest first; `since` keeps only calls that arrived at or after that epoch time."""
        with self._lock:
            return [dict(e) for e in self._calls if since is None or e["at"] >= since]
