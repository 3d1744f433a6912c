"""Run the sandbox inside a test process: `with running_sandbox() as sandbox: ...`.

The server binds 127.0.0.1 port 0, so the OS picks a free port and there is no window in
which another process can take it; it is accepting connections before the context is
entered. The handle talks to the control routes over real HTTP, exactly as a test of the
app would, and on exit the server, its delivery pool and its ticker all stop.

    with running_sandbox(min_session_seconds=60) as sandbox:
        client = stripe.StripeClient("sk_test_x", base_addresses={"api": sandbox.base_url})
        ...
        sandbox.set_outcome(session.id, "paid")
        sandbox.wait_for_event("checkout.session.completed")
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import urlencode, urlsplit

from werkzeug.serving import make_server

from .server import QuietRequestHandler, create_sandbox_app
from .state import Sandbox


class SandboxControlError(Exception):
    """A control route refused the call (its status and message are attached)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class SandboxHandle:
    def __init__(self, base_url: str, sandbox: Sandbox):
        self.base_url = base_url
        # The in-process state, for assertions a test cannot make over HTTP. Hold
        # `sandbox.lock` while reading it.
        self.sandbox = sandbox

    @property
    def min_session_seconds(self) -> int:
        return self.sandbox.min_session_seconds

    # -- HTTP plumbing ---------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        """Call a sandbox route with a JSON body; returns the decoded JSON answer."""
        parts = urlsplit(self.base_url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        try:
            payload = json.dumps(body).encode() if body is not None else b""
            conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        data = json.loads(raw) if raw else None
        if response.status >= 400:
            message = (data or {}).get("error", {}).get("message", raw.decode(errors="replace"))
            raise SandboxControlError(response.status, message)
        return data

    # -- control routes --------------------------------------------------------------

    def set_outcome(
        self, session_id: str, outcome: str, shipping_address: dict | None = None, address: dict | None = None
    ) -> dict:
        """`paid`, `declined` or `async_pending` (with the `shipping_address` a session that collects
        one ships to, else the sandbox's test address; `address`, the customer's, for tax and
        Adaptive Pricing); returns the session as Stripe renders it."""
        body: dict[str, Any] = {"outcome": outcome}
        if shipping_address is not None:
            body["shipping_address"] = shipping_address
        if address is not None:
            body["address"] = address
        return self.request("POST", f"/_sandbox/sessions/{session_id}/outcome", body)

    def async_result(self, session_id: str, result: str) -> dict:
        """Settle an async_pending session: `succeeded` or `failed`."""
        return self.request("POST", f"/_sandbox/sessions/{session_id}/async", {"result": result})

    def refund_outcome(self, refund_id: str, outcome: str) -> dict:
        """Settle a pending refund: `succeeded` or `failed`; returns the refund as Stripe renders it."""
        return self.request("POST", f"/_sandbox/refunds/{refund_id}/outcome", {"outcome": outcome})

    def faults(self, **changes: Any) -> dict:
        """Set any of drop_webhooks, duplicate_webhooks, reorder_webhooks,
        webhook_delay_seconds, refunds_pending, checkout_url_null, api_unavailable,
        api_latency_seconds, api_latency_jitter_seconds, api_hang, api_rate_limit_per_second,
        api_endpoint_rate_limit_per_second, api_rate_limit_next_calls, lock_timeout (0, False or
        None switches one off); returns all current faults. With no arguments,
        just reads them."""
        if not changes:
            return self.request("GET", "/_sandbox/faults")
        return self.request("POST", "/_sandbox/faults", changes)

    def account(self, **changes: Any) -> dict:
        """Change any of the account's settings (see account.py); returns them all. With no
        arguments, just reads them."""
        if not changes:
            return self.request("GET", "/_sandbox/account")
        return self.request("POST", "/_sandbox/account", changes)

    @contextlib.contextmanager
    def api_hanging(self) -> Iterator[None]:
        """`api_hang` on for the block, and off again however the block ends, so no call
        the block started stays held for the sandbox's 120 s maximum."""
        self.faults(api_hang=True)
        try:
            yield
        finally:
            self.faults(api_hang=False)

    # -- request log -----------------------------------------------------------------

    def requests(
        self, *, since: float | None = None, method: str | None = None, path_prefix: str = "/v1"
    ) -> list[dict]:
        """The /v1 calls the sandbox received (the last 10,000), oldest first: dicts with
        `method`, `path`, `at` (epoch seconds on arrival), `idempotency_key` and `status`
        (None while the call is still held by a fault)."""
        calls = self.get("/_sandbox/requests", {"since": repr(since)} if since is not None else None)["calls"]
        return [c for c in calls if c["path"].startswith(path_prefix) and (method is None or c["method"] == method)]

    def request_count(self, *, method: str | None = None, path_prefix: str = "/v1") -> int:
        """How many /v1 calls matching `method` and `path_prefix` arrived since the last reset
        (exact, however many there were)."""
        rows = self.get("/_sandbox/requests")["data"]
        return sum(
            r["count"] for r in rows if r["path"].startswith(path_prefix) and (method is None or r["method"] == method)
        )

    def request_times(
        self, *, since: float | None = None, method: str | None = None, path_prefix: str = "/v1"
    ) -> list[float]:
        """Arrival times (epoch seconds, ascending) of the matching calls."""
        return sorted(c["at"] for c in self.requests(since=since, method=method, path_prefix=path_prefix))

    def peak_requests_per_second(
        self, *, since: float | None = None, method: str | None = None, path_prefix: str = "/v1", window: float = 1.0
    ) -> int:
        """The most matching calls that arrived within any `window` seconds."""
        return peak_in_window(self.request_times(since=since, method=method, path_prefix=path_prefix), window)

    def advance_clock(self, seconds: float) -> dict:
        return self.request("POST", "/_sandbox/clock", {"advance_seconds": seconds})

    def reset(self) -> None:
        self.request("POST", "/_sandbox/reset", {})

    def events(self, type: str | None = None) -> list[dict]:
        """Every event, oldest first, each with `event` (the JSON) and `deliveries`."""
        records = self.request("GET", "/_sandbox/events")["data"]
        return [r for r in records if type is None or r["type"] == type]

    def wait_for_event(
        self,
        type: str,
        *,
        delivered: bool = True,
        count: int = 1,
        timeout: float = 5.0,
    ) -> list[dict]:
        """Wait until `count` events of `type` exist and, if `delivered`, each was sent to
        at least one endpoint and every delivery got a 2xx. Returns those events."""

        def ready() -> list[dict] | None:
            found = self.events(type)
            if delivered:
                found = [
                    e for e in found if e["deliveries"] and all(d["status"] == "succeeded" for d in e["deliveries"])
                ]
            return found if len(found) >= count else None

        return wait_until(ready, timeout=timeout, what=f"{count} x {type}")

    def pay_page_url(self, session_id: str) -> str:
        return f"{self.base_url}/pay/{session_id}"

    def get(self, path: str, query: dict | None = None) -> Any:
        return self.request("GET", path + (f"?{urlencode(query)}" if query else ""))


def wait_until(
    check: Callable[[], Any], *, timeout: float = 5.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Poll `check` until it returns something truthy; fail loudly after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def peak_in_window(times: list[float], window: float = 1.0) -> int:
    """The largest number of `times` (ascending) that fall within any half-open span of
    `window` seconds."""
    peak, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= window:
            start += 1
        peak = max(peak, end - start + 1)
    return peak


@contextlib.contextmanager
def running_sandbox(min_session_seconds: int = 1800) -> Iterator[SandboxHandle]:
    """Serve a fresh sandbox on a free 127.0.0.1 port for the duration of the block."""
    app = create_sandbox_app(min_session_seconds)
    sandbox: Sandbox = app.extensions["stripe_sandbox"]
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietRequestHandler)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name=f"stripe-sandbox-{server.port}",
        daemon=True,
    )
    thread.start()
    try:
        yield SandboxHandle(f"http://127.0.0.1:{server.port}", sandbox)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        sandbox.close()


@dataclass
class ReceivedWebhook:
    body: bytes
    headers: dict[str, str]
    status: int  # what the receiver answered
    at: float

    @property
    def signature(self) -> str:
        return self.headers.get("Stripe-Signature", "")

    def json(self) -> dict:
        return json.loads(self.body)


class WebhookReceiver:
    """A tiny webhook receiver on a free 127.0.0.1 port that records every POST.

    `fail_next(n, status)` makes the next n deliveries fail with `status`; everything else
    gets a 200. Use as a context manager or call `close()`.
    """

    def __init__(self, path: str = "/webhooks/stripe"):
        self.path = path
        self.received: list[ReceivedWebhook] = []
        self._failures: list[int] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    status = receiver._failures.pop(0) if receiver._failures else 200
                    receiver.received.append(ReceivedWebhook(body, dict(self.headers.items()), status, time.time()))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}{self.path}"

    def fail_next(self, count: int, status: int = 500) -> None:
        with self._lock:
            self._failures.extend([status] * count)

    def accepted(self) -> list[ReceivedWebhook]:
        """Deliveries this receiver answered with a 2xx, in arrival order."""
        with self._lock:
            return [r for r in self.received if 200 <= r.status < 300]

    def wait_for(self, count: int, *, timeout: float = 5.0) -> list[ReceivedWebhook]:
        """Wait until at least `count` deliveries were accepted; returns them all."""
        return wait_until(
            lambda: (lambda got: got if len(got) >= count else None)(self.accepted()),
            timeout=timeout,
            what=f"{count} accepted webhook(s) at {self.url}",
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "WebhookReceiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
