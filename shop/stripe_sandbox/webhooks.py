"""Webhook signing and delivery, the way Stripe does both.

Signing: `Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed by the
endpoint secret>`. `t` is real wall-clock time, never the sandbox clock, so a receiver's
timestamp tolerance check passes however far a test has advanced the sandbox clock.

Delivery: a scheduler thread keeps a heap of due attempts and hands each to a small thread
pool, so a slow or dead receiver never holds up the API or other receivers. A non-2xx answer
(or a connection error, timeout or redirect, which Stripe also counts as failures) is retried
with exponential backoff, 0.5 s doubling to a 4 s cap, for up to three days of real time, or
until the endpoint is deleted or disabled or the sandbox is reset. Every attempt is recorded.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import http.client
import itertools
import logging
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .objects import Attempt, Delivery

if TYPE_CHECKING:
    from .state import Sandbox

log = logging.getLogger(__name__)

FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 4.0
RETRY_WINDOW_SECONDS = 3 * 24 * 3600
ATTEMPT_TIMEOUT_SECONDS = 10.0
USER_AGENT = "Stripe/1.0 (+https://stripe.com/docs/webhooks)"


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    signed = f"{timestamp}.".encode("utf-8") + body
    digest = hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def retry_delay(failed_attempts: int) -> float:
    """Seconds to wait after the n-th consecutive failure (n >= 1)."""
    return min(FIRST_RETRY_SECONDS * 2 ** (failed_attempts - 1), MAX_RETRY_SECONDS)


def post(url: str, body: bytes, signature: str, timeout: float) -> tuple[int | None, str | None]:
    """POST one webhook; returns (status code, None) or (None, error text).

    Plain http.client: no proxies from the environment and no redirect following (Stripe
    treats a 3xx as a failed delivery).
    """
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        if parts.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        try:
            conn.request(
                "POST",
                path,
                body=body,
                headers={
                    "Content-Type": "application/json; charset=utf-8",
                    "User-Agent": USER_AGENT,
                    "Stripe-Signature": signature,
                    "Cache-Control": "no-cache",
                },
            )
            response = conn.getresponse()
            response.read(65536)
            return response.status, None
        finally:
            conn.close()
    except Exception as exc:  # connection refused, timeout, TLS, bad URL: all a failed attempt
        return None, f"{type(exc).__name__}: {exc}"


class WebhookDispatcher:
    def __init__(self, sandbox: "Sandbox", *, workers: int = 8):
        self.sandbox = sandbox
        # Shares the sandbox lock, so scheduling from inside a request is atomic with it.
        self._cond = threading.Condition(sandbox.lock)
        self._heap: list[tuple[float, int, int, list[Delivery]]] = []
        self._order = itertools.count()
        self._generation = 0
        self._stopped = False
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="stripe-sandbox-webhook")
        self._thread = threading.Thread(target=self._loop, name="stripe-sandbox-dispatcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._generation += 1
            self._heap.clear()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def clear(self) -> None:
        """Forget every queued attempt; attempts in flight finish but record nothing."""
        with self._cond:
            self._generation += 1
            self._heap.clear()

    def schedule(self, chain: list[Delivery], delay: float) -> None:
        """Queue deliveries to start after `delay` seconds.

        A chain of several deliveries runs in order, each first attempt finishing before the
        next starts (how reordered events keep their order on the wire); their retries, if
        any, are scheduled independently.
        """
        with self._cond:
            due = time.monotonic() + max(delay, 0.0)
            for delivery in chain:
                delivery.next_attempt_at = time.time() + max(delay, 0.0)
            heapq.heappush(self._heap, (due, next(self._order), self._generation, chain))
            self._cond.notify_all()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, generation, chain = heapq.heappop(self._heap)
                if generation != self._generation or self._pool is None:
                    continue
                try:
                    self._pool.submit(self._run_chain, chain, generation)
                except RuntimeError:  # pool shut down underneath us
                    return

    def _run_chain(self, chain: list[Delivery], generation: int) -> None:
        for delivery in chain:
            try:
                self._attempt(delivery, generation)
            except Exception:
                log.exception("webhook delivery %s crashed", delivery.id)

    def _attempt(self, delivery: Delivery, generation: int) -> None:
        sandbox = self.sandbox
        with self._cond:
            if generation != self._generation or self._stopped or delivery.status != "pending":
                return
            endpoint = sandbox.endpoints.get(delivery.endpoint_id)
            if endpoint is None or endpoint.status != "enabled":
                delivery.status = "abandoned"
                delivery.abandoned_reason = "endpoint deleted" if endpoint is None else "endpoint disabled"
                delivery.next_attempt_at = None
                return
            event = sandbox.events.get(delivery.event_id)
            if event is None:
                return
            url, secret, body = endpoint.url, endpoint.secret, event.body
            delivery.url = url
        started = time.time()
        timestamp = int(started)
        status, error = post(url, body, signature_header(body, secret, timestamp), ATTEMPT_TIMEOUT_SECONDS)
        with self._cond:
            if generation != self._generation or delivery.status != "pending":
                return
            delivery.attempts.append(
                Attempt(
                    at=started,
                    status_code=status,
                    error=error,
                    duration_ms=int((time.time() - started) * 1000),
                )
            )
            if status is not None and 200 <= status < 300:
                delivery.status = "succeeded"
                delivery.next_attempt_at = None
                return
            if time.time() - delivery.attempts[0].at > RETRY_WINDOW_SECONDS:
                delivery.status = "abandoned"
                delivery.abandoned_reason = "retry window exhausted"
                delivery.next_attempt_at = None
                return
            self.schedule([delivery], retry_delay(len(delivery.attempts)))
