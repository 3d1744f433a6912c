"""The SDK's transport, with the guard at every attempt: the client for whoever is calling
(`client`), each request's rate budget (taken per endpoint, as late as requests allows), the
request's time budget, and a 429's pause; and where the provider is (`api_base`, the hosted
pages' origins)."""

from __future__ import annotations

import logging
import re
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from urllib.parse import urlsplit

import requests.adapters  # binds `requests` too; the adapters submodule named for the checker
import stripe
from flask import current_app
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, ProxyManager
from urllib3.connection import HTTPConnection, HTTPSConnection

from .. import clock
from ..extensions import per_app
from . import guard
from .errors import is_lock_timeout, retry_after_seconds

log = logging.getLogger("shop.provider")

SANDBOX_DEFAULT_BASE = "http://127.0.0.1:12111"
SANDBOX_API_KEY = "sk_test_backstop_sandbox"


def api_base() -> str | None:
    cfg = current_app.config
    if cfg.get("STRIPE_API_BASE"):
        return cfg["STRIPE_API_BASE"]
    return None if cfg.get("STRIPE_SECRET_KEY") else SANDBOX_DEFAULT_BASE


# Stripe's hosted Checkout pages live here; the sandbox serves its own at its API address.
STRIPE_CHECKOUT_ORIGIN = "https://checkout.stripe.com"


def hosted_page_origins(config) -> list[str]:
    """Where a checkout's redirect can send the customer: the pages' Content-Security-Policy must
    let a form's redirect go there (browsers apply `form-action` to the redirects a form leads
    to). Stripe's Checkout with a real key; the sandbox serves its page at its API address."""
    origins = [STRIPE_CHECKOUT_ORIGIN] if config.get("STRIPE_SECRET_KEY") else []
    base = config.get("STRIPE_API_BASE") or (None if origins else SANDBOX_DEFAULT_BASE)
    if base:
        parts = urlsplit(base)
        origins.append(f"{parts.scheme}://{parts.netloc}")
    return origins


def client() -> stripe.StripeClient:
    """The SDK client for whoever is calling (guard.current()): a customer's request gets at most
    one network retry, each attempt bounded by the request's time budget; background work keeps
    the SDK's retries and STRIPE_TIMEOUT_SECONDS. Both share one transport."""
    customer = guard.current().priority == guard.Priority.CUSTOMER
    cfg = current_app.config

    def build() -> stripe.StripeClient:
        base = api_base()
        transport = per_app("stripe_http", lambda: _http_client(base or STRIPE_API, cfg["STRIPE_TIMEOUT_SECONDS"]))
        return stripe.StripeClient(
            cfg.get("STRIPE_SECRET_KEY") or SANDBOX_API_KEY,
            base_addresses={"api": base} if base else None,
            max_network_retries=cfg["STRIPE_REQUEST_MAX_NETWORK_RETRIES" if customer else "STRIPE_MAX_NETWORK_RETRIES"],
            http_client=transport,
        )

    return per_app("stripe_customer" if customer else "stripe", build)


STRIPE_API = "https://api.stripe.com"


class GuardedHttpClient(stripe.RequestsClient):
    """The SDK's requests transport, with the guard at every attempt (the SDK's own retries
    included): each one spends a unit of the shared rate budget (taken in _BudgetedAdapter, as
    late as requests allows) and, inside a customer's request, fits in what is left of its time
    budget. A 429 pauses every process until its Retry-After and is retried (same request, same
    Idempotency-Key) while the caller's time allows it (`_retry_429`); one that does not fit
    reaches the caller as ProviderUnavailable (checkout puts the order in line)."""

    def __init__(self, *, app, background_timeout: float, **kwargs):
        self._app = app
        self._background_timeout = background_timeout
        self._attempt = threading.local()
        super().__init__(timeout=background_timeout, **kwargs)

    @property
    def _timeout(self):
        ctx = guard.current()
        if ctx.priority == guard.Priority.CUSTOMER:
            cfg = self._app.config
            connect, read = cfg["STRIPE_REQUEST_CONNECT_TIMEOUT_SECONDS"], cfg["STRIPE_REQUEST_READ_TIMEOUT_SECONDS"]
        elif ctx.deadline is None:
            return self._background_timeout
        else:  # a web request that is not a customer's (the console): background timeouts, its deadline
            connect = read = self._background_timeout
        if ctx.deadline is not None:
            read = min(read, max(0.05, ctx.deadline - clock.current().monotonic()))
        return (min(connect, read), read)

    @_timeout.setter
    def _timeout(self, value):  # the SDK's constructor assigns it; the property above decides
        pass

    def request(self, method, url, headers, post_data=None):
        if getattr(self._attempt, "retry", False):
            # The SDK's own retry of a failed attempt: not once the breaker has opened meanwhile
            # (no call goes out while it is open but the shop's one probe).
            self._attempt.retry = False
            guard.get().admit()
        until, self._attempt.limited_until = getattr(self._attempt, "limited_until", None), None
        if until is None:
            return self._attempt_request(method, url, headers, post_data)
        # The retry of a 429: it waits for the budget (paused until the Retry-After) as long as
        # the caller's time leaves room for the attempt itself.
        with guard.patient_until(until - MIN_ATTEMPT_SECONDS):
            return self._attempt_request(method, url, headers, post_data)

    def _attempt_request(self, method, url, headers, post_data):
        ctx = guard.current()
        if ctx.deadline is not None and ctx.deadline - clock.current().monotonic() < MIN_ATTEMPT_SECONDS:
            raise guard.Shed(
                "no time left in this request's budget for another provider call", kind=guard.ShedKind.DEADLINE
            )
        started = time.monotonic()
        status = rheaders = failure = None
        sent = True
        try:
            content, status, rheaders = super().request(method, url, headers, post_data)
        except guard.Shed as exc:  # refused by the rate budget: never sent
            failure, sent = str(exc), False
            raise
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            log_call(method, url, headers, status, rheaders, time.monotonic() - started, failure, sent)
        if status == 429 and not is_lock_timeout(content):  # a rate limit: every process waits
            guard.get().pause(retry_after_seconds(rheaders))
        return content, status, rheaders

    def _handle_request_error(self, e):
        if isinstance(e, guard.Shed):  # refused in _BudgetedAdapter: no request went out, nothing failed
            raise e
        super()._handle_request_error(e)

    def _should_retry(self, response, api_connection_error, num_retries, max_network_retries):
        if num_retries == 0:  # a new call: none of its retries were a 429's yet
            self._attempt.limited, self._attempt.limited_wait = 0, None
        if response is not None and response[1] == 429:
            # A lock_timeout (two requests at one object) is retried the same way, after a short wait.
            wait = LOCK_RETRY_SECONDS if is_lock_timeout(response[0]) else retry_after_seconds(response[2])
            retry = bool(max_network_retries) and self._retry_429(response[2], wait)
            self._attempt.limited += retry
        else:
            # A 429's retries are not network retries: they leave the SDK's own count alone.
            retry = super()._should_retry(
                response, api_connection_error, num_retries - self._attempt.limited, max_network_retries
            )
        self._attempt.retry = retry
        return retry

    def _retry_429(self, rheaders, wait: float) -> bool:
        """Whether a 429 is retried: not after `Stripe-Should-Retry: false` nor by a client that
        makes no retries (the probe, the preflight); else when its Retry-After (guard.pause has
        stopped every process until then) and one more attempt fit in the caller's time: what is
        left of the request's budget (a web request, a customer's call), else its patience for
        the rate budget (a job: its own, or STRIPE_BACKGROUND_WAIT_SECONDS) from the first 429."""
        if str((rheaders or {}).get("Stripe-Should-Retry", "")).lower() == "false":
            return False
        ctx, now = guard.current(), clock.current().monotonic()
        until = ctx.deadline
        if until is None:
            if self._attempt.limited == 0:
                self._attempt.limited_since = now
            patience = ctx.patience if ctx.patience is not None else guard.get().limits.background_wait_seconds
            until = self._attempt.limited_since + patience
        if now + wait + MIN_ATTEMPT_SECONDS > until:
            return False
        self._attempt.limited_until, self._attempt.limited_wait = until, wait
        return True

    def _sleep_time_seconds(self, num_retries: int) -> float:
        wait, self._attempt.limited_wait = getattr(self._attempt, "limited_wait", None), None
        if wait is not None:  # a 429's retry: its Retry-After, not the SDK's backoff
            return wait
        return super()._sleep_time_seconds(num_retries)


def outcome_of(status: int | None, sent: bool = True) -> str:
    """A provider call's `outcome` in its log line: ok, refused (4xx), rate_limited (429),
    unavailable (5xx), unreachable (no answer: connection error, timeout), not_sent (the rate
    budget refused it)."""
    if status is None:
        return "unreachable" if sent else "not_sent"
    if status < 300:
        return "ok"
    if status == 429:
        return "rate_limited"
    return "unavailable" if status >= 500 else "refused"


# The watch's health checks (provider.watch): every 2 s in each scheduler, so their lines are
# DEBUG; the watch itself says when the answer changes.
_quiet = ContextVar("backstop_quiet_provider_calls", default=False)


@contextmanager
def quiet_calls():
    """Calls made inside are logged at DEBUG, whatever their outcome."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def log_call(method, url, headers, status, rheaders, seconds: float, failure: str | None, sent: bool = True) -> None:
    """One line per provider call (each HTTP attempt, the SDK's retries included): the endpoint,
    the latency, the outcome and status, the provider's request id and the idempotency key, on
    top of the log context (the request, job, work and order it was made for; shop.logs)."""
    endpoint = endpoint_of(method, url)
    outcome = outcome_of(status, sent)
    provider_request_id = rheaders.get("Request-Id") if rheaders is not None else None
    key = (headers or {}).get("Idempotency-Key")
    latency_ms = round(seconds * 1000, 1)
    level = logging.INFO if outcome in ("ok", "refused", "not_sent") else logging.WARNING
    if _quiet.get():
        level = logging.DEBUG
    log.log(
        level,
        "provider call %s: %s%s in %.1f ms%s%s",
        endpoint,
        outcome,
        f" {status}" if status is not None else f" ({failure})",
        latency_ms,
        f", request {provider_request_id}" if provider_request_id else "",
        f", idempotency key {key}" if key else "",
        extra={
            name: value
            for name, value in (
                ("endpoint", endpoint),
                ("latency_ms", latency_ms),
                ("outcome", outcome),
                ("status", status),
                ("provider_request_id", provider_request_id),
                ("idempotency_key", key),
            )
            if value is not None
        },
    )


# An attempt with less time than this left in the request's budget could not get an answer.
MIN_ATTEMPT_SECONDS = 0.3
# A lock_timeout's retry waits this long: the other request holding the object is usually done.
LOCK_RETRY_SECONDS = 0.25


# Where new payment sessions are made: the endpoint whose budget the checkout queue shares out.
SESSION_CREATE = "POST /v1/checkout/sessions"
_ID_SEGMENT = re.compile(r"^[a-z]{2,4}_|[A-Z0-9]")
_VERSION_SEGMENT = re.compile(r"v[0-9]+")


def endpoint_of(method: str, url: str) -> str:
    """The endpoint a request is counted against, as Stripe counts its per-endpoint limits: the
    method and the path template, `GET /v1/checkout/sessions/{id}` for every session. A path
    segment is an object's id when it starts with an id's prefix (two to four letters and an
    underscore: `cs_`, `pi_`, `evt_`) or holds a capital letter or a digit; resource and action
    names are lowercase words (`checkout`, `payment_intents`, `expire`), and `v1` is the version."""
    path = urlsplit(url).path
    parts = [
        "{id}" if _ID_SEGMENT.search(part) and not _VERSION_SEGMENT.fullmatch(part) else part
        for part in path.split("/")
    ]
    return f"{method.upper()} {'/'.join(parts)}"


# The grant taken for the request this thread is sending (_BudgetedAdapter.send), until the
# connection confirms it right before writing the request (_GrantConfirming).
_sending = threading.local()


class _GrantConfirming(HTTPConnection):
    """A urllib3 connection that confirms the request's grant (guard.Budget.confirm) at the last
    moment: once the connection is made and right before the request's first byte is written. A
    pooled connection is checked for being dropped, and made when there is none, after the
    adapter took the grant; under load a thread can wait there for the GIL long enough for its
    request to reach the provider within the same second as the next window's grants."""

    _grant = None  # (guard, grant) for the request being written

    def request(self, method, url, body=None, headers=None, **kwargs):
        pending = getattr(_sending, "pending", None)
        _sending.pending = None
        if pending is not None and self.sock is None:
            self.connect()  # now, not in the first write: the grant is confirmed after it
        self._grant = pending
        try:
            return super().request(method, url, body, headers, **kwargs)
        finally:
            self._grant = None

    def send(self, data):
        pending = self._grant
        if pending is not None:  # the request's first write: its headers
            self._grant = None
            provider_guard, grant = pending
            if not grant.fresh():
                provider_guard.confirm(grant)
        return super().send(data)


class _GrantConfirmingHTTPConnection(_GrantConfirming, HTTPConnection):
    pass


class _GrantConfirmingHTTPSConnection(_GrantConfirming, HTTPSConnection):
    pass


# Ignored: urllib3's own connection classes fail its ConnectionCls protocol (default_socket_options is Final).
class _GrantConfirmingHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GrantConfirmingHTTPConnection  # pyright: ignore[reportAssignmentType]


class _GrantConfirmingHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GrantConfirmingHTTPSConnection  # pyright: ignore[reportAssignmentType]


_GRANT_CONFIRMING_POOLS = {"http": _GrantConfirmingHTTPPool, "https": _GrantConfirmingHTTPSPool}


class _BudgetedAdapter(requests.adapters.HTTPAdapter):
    """Takes the rate budget's token for each request the SDK sends (its retries included), and
    has the connection confirm it right before the request is written (_GrantConfirming): the
    budget bounds calls as the provider counts them, on arrival, per account and per endpoint,
    so the time between the grant and the write must stay short (guard.GRANT_FRESH_SECONDS).
    The token is taken here, before a connection is held, so a call that waits for the budget or
    is refused holds no connection; a grant grown stale by the write is given back and another
    taken there. Through a SOCKS proxy (urllib3's own connections) the grant is not confirmed."""

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _GRANT_CONFIRMING_POOLS

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:
            manager.pool_classes_by_scheme = _GRANT_CONFIRMING_POOLS
        return manager

    def send(self, request, *args, **kwargs):
        endpoint = endpoint_of(request.method, request.url)
        # The SDK runs inside guarded.guarded_call, in the app's context.
        provider_guard = guard.get()
        grant = provider_guard.take_token(endpoint, behind_line=endpoint == SESSION_CREATE)
        _sending.pending = (provider_guard, grant)
        try:
            return super().send(request, *args, **kwargs)
        finally:
            _sending.pending = None


def _http_client(base: str, timeout: float) -> GuardedHttpClient:
    """The SDK's requests transport with the environment read once, not on every call.

    A requests.Session that trusts the environment re-reads every environment variable on each
    request (proxies, no_proxy, netrc): a noticeable share of a checkout's web CPU
    (bench/checkout.py prints a checkout's CPU).
    The proxy settings that apply to the provider's address are read here, once, and handed
    to the SDK explicitly (HTTPS_PROXY / NO_PROXY still work; they are read at start). The
    SDK keeps one such session for every thread: urllib3's pool behind it is thread-safe, and
    nothing here uses the session's cookies."""
    session = requests.Session()
    session.trust_env = False
    # Enough pooled connections for every web thread (urllib3 keeps 10 by default and drops the rest).
    adapter = _BudgetedAdapter(pool_connections=4, pool_maxsize=max(10, current_app.config["WEB_THREADS"]))
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    proxies = {
        scheme: url for scheme, url in requests.utils.get_environ_proxies(base).items() if scheme in ("http", "https")
    }
    app = current_app._get_current_object()  # pyright: ignore[reportAttributeAccessIssue]  # Flask types its proxy as Flask
    return GuardedHttpClient(app=app, background_timeout=timeout, session=session, proxy=proxies or None)
