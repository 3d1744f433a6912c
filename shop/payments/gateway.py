"""The payment gateway: the only module that imports `stripe`.

Everything the rest of the shop learns from the provider comes out of here as plain values
(`SessionView`, `RefundView`), so no stripe object (which in stripe 16 is not a dict) leaks.
Every creating call carries an Idempotency-Key derived from what the call is for, so a retried
request (ours, or the SDK's own network retry) never creates a second object.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlsplit

import requests
import stripe
from flask import current_app

from ..domain.deadlines import utcnow
from ..extensions import db, per_app
from ..outbox import dispatch
from . import guard

log = logging.getLogger("shop.payments")

SANDBOX_DEFAULT_BASE = "http://127.0.0.1:12111"
SANDBOX_API_KEY = "sk_test_backstop_sandbox"
EVENT_TYPES = [
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
    "refund.updated",
    "refund.failed",
]
# A refund's news (docs/REFERENCE.md, Webhook): its object is the refund, not a session.
REFUND_EVENT_TYPES = ("refund.updated", "refund.failed")


# Why a call could not be made or answered (ProviderUnavailable.kind): the guard's refusals
# (guard.BUDGET, BULKHEAD, LINE, BREAKER, DEADLINE), the provider's own 429, or the provider
# not answering (connection errors, timeouts, 5xx).
RATE_LIMITED, UNREACHABLE = "rate_limited", "unreachable"
# Refusals that say the provider is fine but its budget (or this process's share of slots) is
# spent for now: an order whose session could not be created for one of these waits in line.
BUDGET_KINDS = frozenset({guard.BUDGET, guard.BULKHEAD, guard.LINE, RATE_LIMITED})


class ProviderUnavailable(Exception):
    """The provider could not be reached, timed out, or answered 5xx/429, or the guard refused
    the call: try again later. `kind` says which (see BUDGET_KINDS).

    Durable work that meets it waits for the provider instead of spending its attempt budget
    (the runner reads `failure_kind`; see domain.deadlines.retry_decision)."""

    failure_kind = "provider"
    kind = UNREACHABLE
    retry_after: float | None = None


class ProviderRefused(Exception):
    """The provider understood and said no (4xx)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class SignatureProblem(Exception):
    """The webhook's signature is missing, wrong or stale."""


@dataclass(frozen=True)
class SessionView:
    id: str
    status: str | None  # open | complete | expired
    payment_status: str | None  # paid | unpaid | no_payment_required
    amount_total: int | None
    currency: str | None
    url: str | None
    payment_intent: str | None
    expires_at: datetime | None
    order_id: int | None  # from metadata.order_id
    client_reference_id: str | None


@dataclass(frozen=True)
class RefundView:
    id: str | None
    status: str | None  # pending | requires_action | succeeded | failed | canceled; nullable
    amount: int | None
    payment_intent: str | None  # nullable at Stripe
    failure_reason: str | None  # only on a failed refund
    order_id: int | None  # from metadata: the shop's own (order, session, attempt)
    session_id: str | None
    attempt: int | None


def refund_view(obj) -> RefundView:
    """Accepts a stripe object or a plain dict (an event's data.object), read as defensively as
    `session_view`: a field of the wrong type reads as absent."""
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        obj = {}
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}

    def text(value):
        return value if isinstance(value, str) else None

    def number(value):
        value = int(value) if isinstance(value, str) and value.isdigit() and len(value) < 10 else value
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None

    intent = obj.get("payment_intent")
    return RefundView(
        id=text(obj.get("id")),
        status=text(obj.get("status")),
        amount=number(obj.get("amount")),
        payment_intent=text(intent.get("id") if isinstance(intent, dict) else intent),
        failure_reason=text(obj.get("failure_reason")),
        order_id=number(metadata.get("order_id")),
        session_id=text(metadata.get("session_id")),
        attempt=number(metadata.get("attempt")) or 1,
    )


def session_view(obj) -> SessionView:
    """Accepts a stripe object or a plain dict (an event's data.object).

    An event's object is the sender's JSON, checked only for its signature: a field of the wrong
    type reads as absent here (the order is then not found, or the proof check refuses it), so
    a malformed notice is answered, never a crash."""
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        obj = {}
    metadata = obj.get("metadata")
    raw_order = metadata.get("order_id") if isinstance(metadata, dict) else None
    order_id = (
        int(raw_order)
        if isinstance(raw_order, str) and raw_order.isdigit() and len(raw_order) < 12
        else raw_order
        if isinstance(raw_order, int) and not isinstance(raw_order, bool)
        else None
    )
    intent = obj.get("payment_intent")
    if isinstance(intent, dict):
        intent = intent.get("id")
    expires = obj.get("expires_at")
    amount = obj.get("amount_total")

    def text(value):
        return value if isinstance(value, str) else None

    return SessionView(
        id=text(obj.get("id")),
        status=text(obj.get("status")),
        payment_status=text(obj.get("payment_status")),
        # Beyond a 32-bit amount no order could match it (and no column could hold it).
        amount_total=amount
        if isinstance(amount, int) and not isinstance(amount, bool) and 0 <= amount < 2**31
        else None,
        currency=text(obj.get("currency")),
        url=text(obj.get("url")),
        payment_intent=text(intent),
        expires_at=(
            datetime.fromtimestamp(expires, timezone.utc)
            if isinstance(expires, int) and not isinstance(expires, bool) and 0 <= expires < 2**37
            else None
        ),
        order_id=order_id,
        client_reference_id=text(obj.get("client_reference_id")),
    )


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
    customer = guard.current().priority == guard.CUSTOMER
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
    budget. A 429 is not retried here: it pauses
    every process until its Retry-After and reaches the caller as ProviderUnavailable (background
    work is retried later; checkout offers "Pay now")."""

    def __init__(self, *, app, background_timeout: float, **kwargs):
        self._app = app
        self._background_timeout = background_timeout
        self._attempt = threading.local()
        super().__init__(timeout=background_timeout, **kwargs)

    @property
    def _timeout(self):
        ctx = guard.current()
        if ctx.priority == guard.CUSTOMER:
            cfg = self._app.config
            connect, read = cfg["STRIPE_REQUEST_CONNECT_TIMEOUT_SECONDS"], cfg["STRIPE_REQUEST_READ_TIMEOUT_SECONDS"]
        elif ctx.deadline is None:
            return self._background_timeout
        else:  # a web request that is not a customer's (the console): background timeouts, its deadline
            connect = read = self._background_timeout
        if ctx.deadline is not None:
            read = min(read, max(0.05, ctx.deadline - time.monotonic()))
        return (min(connect, read), read)

    @_timeout.setter
    def _timeout(self, value):  # the SDK's constructor assigns it; the property above decides
        pass

    def request(self, method, url, headers, post_data=None):
        ctx = guard.current()
        if getattr(self._attempt, "retry", False):
            # The SDK's own retry of a failed attempt: not once the breaker has opened meanwhile
            # (no call goes out while it is open but the shop's one probe).
            self._attempt.retry = False
            guard.get().admit()
        if ctx.deadline is not None and ctx.deadline - time.monotonic() < MIN_ATTEMPT_SECONDS:
            raise guard.Shed("no time left in this request's budget for another provider call", kind=guard.DEADLINE)
        content, status, rheaders = super().request(method, url, headers, post_data)
        if status == 429:
            guard.get().pause(_retry_after(rheaders))
        return content, status, rheaders

    def _handle_request_error(self, e):
        if isinstance(e, guard.Shed):  # refused in _BudgetedAdapter: no request went out, nothing failed
            raise e
        super()._handle_request_error(e)

    def _should_retry(self, response, api_connection_error, num_retries, max_network_retries):
        if response is not None and response[1] == 429:
            return False  # waiting out Retry-After belongs to the caller, not to a thread here
        retry = super()._should_retry(response, api_connection_error, num_retries, max_network_retries)
        self._attempt.retry = retry
        return retry


# An attempt with less time than this left in the request's budget could not get an answer.
MIN_ATTEMPT_SECONDS = 0.3
# A 429 without Retry-After: Stripe's advice is to back off about a second.
DEFAULT_RETRY_AFTER_SECONDS = 1.0
MAX_RETRY_AFTER_SECONDS = 60.0


def _retry_after(headers) -> float:
    try:
        seconds = float((headers or {}).get("Retry-After"))
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER_SECONDS
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS) or DEFAULT_RETRY_AFTER_SECONDS


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


class _BudgetedAdapter(requests.adapters.HTTPAdapter):
    """Takes the rate budget's token for each request the SDK sends (its retries included), at
    the last point before the connection is written to: the budget bounds calls as the provider
    counts them, on arrival, per account and per endpoint, so the time between the grant and the
    send must stay short (guard.GRANT_FRESH_SECONDS)."""

    def send(self, request, *args, **kwargs):
        endpoint = endpoint_of(request.method, request.url)
        # The SDK runs inside gateway._call, in the app's context.
        guard.get().take_token(endpoint, behind_line=endpoint == SESSION_CREATE)
        return super().send(request, *args, **kwargs)


def _http_client(base: str, timeout: float) -> GuardedHttpClient:
    """The SDK's requests transport with the environment read once, not on every call.

    A requests.Session that trusts the environment re-reads every environment variable on each
    request (proxies, no_proxy, netrc): measured at about a tenth of a checkout's web CPU.
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
    return GuardedHttpClient(
        app=current_app._get_current_object(), background_timeout=timeout, session=session, proxy=proxies or None
    )


def _call(what: str, fn):
    """Every SDK call goes through here: the bulkhead, the breaker, then the call (whose attempts
    meet the rate budget in GuardedHttpClient). A refusal by the guard is ProviderUnavailable
    with no call made; a failure or timeout of the provider counts toward the breaker, and while
    the breaker is open this process makes sure a prober watches for the provider's return."""
    provider_guard = guard.get()
    try:
        with provider_guard.slot():
            provider_guard.admit()
            try:
                result = fn()
            except stripe.StripeError as exc:
                if provider_guard.record(ok=not _counts_as_failure(exc)) != guard.CLOSED:
                    _watch_for_recovery(provider_guard)
                raise
            provider_guard.record(ok=True)
            return result
    except guard.Shed as exc:
        if exc.kind == guard.BREAKER:
            _watch_for_recovery(provider_guard)
        raise _unavailable(f"{what}: not called: {exc}", exc.retry_after, exc.kind) from exc
    except (stripe.APIConnectionError, stripe.RateLimitError) as exc:
        limited = isinstance(exc, stripe.RateLimitError)
        raise _unavailable(
            f"{what}: {exc.user_message or exc}",
            _retry_after(exc.headers) if limited else None,
            RATE_LIMITED if limited else UNREACHABLE,
        ) from exc
    except stripe.StripeError as exc:
        status = getattr(exc, "http_status", None) or 0
        if status >= 500 or status == 0 or status == 429:
            raise _unavailable(
                f"{what}: provider error {status}: {exc.user_message or exc}",
                _retry_after(exc.headers) if status == 429 else None,
                RATE_LIMITED if status == 429 else UNREACHABLE,
            ) from exc
        raise ProviderRefused(f"{what}: {exc.user_message or exc}", getattr(exc, "code", None)) from exc


def _counts_as_failure(exc: stripe.StripeError) -> bool:
    """A failure of the provider (the breaker counts it), not a refusal of this one request."""
    status = getattr(exc, "http_status", None) or 0
    return isinstance(exc, (stripe.APIConnectionError, stripe.RateLimitError)) or status >= 500 or status in (0, 429)


def _unavailable(message: str, retry_after: float | None, kind: str) -> ProviderUnavailable:
    """ProviderUnavailable, saying why and when to try again if the guard or the provider said (a
    429's Retry-After, the next probe, the rate budget's next token)."""
    exc = ProviderUnavailable(message)
    exc.retry_after = retry_after
    exc.kind = kind
    return exc


# -- the probe -------------------------------------------------------------------------------

# The probe's own time: it must not hold its claim (guard: STRIPE_BREAKER_PROBE_SECONDS) or the
# next probe for long when the provider hangs.
PROBE_TIMEOUT_SECONDS = 2.0


def _watch_for_recovery(provider_guard: guard.ProviderGuard) -> None:
    provider_guard.watch_for_recovery(current_app._get_current_object(), probe, on_recovered=_recovered)


def probe() -> bool | None:
    """The shop's one probe while the breaker is open: a cheap read (the newest event, at most
    one), outside the breaker (it is what closes it) but inside this process's bulkhead and the
    rate budget. True when the provider answered (even a refusal of this request is an answer),
    False when it failed, None when there was no slot or budget to try now."""
    provider_guard = guard.get()
    probe_client = per_app(
        "stripe_probe",
        lambda: stripe.StripeClient(
            current_app.config.get("STRIPE_SECRET_KEY") or SANDBOX_API_KEY,
            base_addresses={"api": api_base()} if api_base() else None,
            max_network_retries=0,
            http_client=per_app(
                "stripe_http",
                lambda: _http_client(api_base() or STRIPE_API, current_app.config["STRIPE_TIMEOUT_SECONDS"]),
            ),
        ),
    )
    try:
        with provider_guard.slot(wait=0), guard.customer_call(PROBE_TIMEOUT_SECONDS):
            probe_client.v1.events.list(params={"limit": 1})
    except guard.Shed:
        return None
    except stripe.StripeError as exc:
        return not _counts_as_failure(exc)
    return True


def _recovered() -> None:
    """The probe closed the breaker: work that backed off for the provider (refunds, deadlines
    asking about a session) runs now, not at its next retry up to minutes away."""
    try:
        dispatch.wake_provider_waiters(utcnow())
    except Exception:  # noqa: BLE001 - the sweep wakes them at its next cycle too
        log.exception("could not wake the work that waited for the provider")
    finally:
        db.session.remove()


def create_checkout_session(
    *,
    order_id: int,
    reference: str,
    attempt: int,
    lines,
    currency: str,
    email: str,
    success_url: str,
    cancel_url: str,
    expires_at: datetime,
) -> SessionView:
    params = {
        "mode": "payment",
        "client_reference_id": reference,
        "metadata": {"order_id": str(order_id), "reference": reference},
        "customer_email": email,
        "success_url": success_url,
        "cancel_url": cancel_url,
        "expires_at": int(expires_at.timestamp()),
        "line_items": [
            {
                "quantity": line.quantity,
                "price_data": {
                    "currency": currency,
                    "unit_amount": line.unit_price,
                    "product_data": {"name": f"{line.name} ({line.sku})"},
                },
            }
            for line in lines
        ],
    }
    # The key names the attempt AND the session's end: a network retry of this very call is
    # replayed (same key, same parameters), while a later "Pay now" for an attempt whose save was
    # lost (the session was created, the order's update was not) asks for a later expires_at and
    # must get a new session: the provider refuses a key reused with other parameters, which
    # refused every "Pay now" until the deadline cancelled the order.
    key = f"backstop-order-{order_id}-session-attempt-{attempt}-until-{int(expires_at.timestamp())}"
    if guard.get().line_seen_held():
        raise _unavailable(
            "create checkout session: not called: customers are waiting in line for a payment session", None, guard.LINE
        )
    session = _call(
        "create checkout session",
        lambda: client().v1.checkout.sessions.create(params=params, options={"idempotency_key": key}),
    )
    return session_view(session)


def retrieve_session(session_id: str) -> SessionView:
    return session_view(_call("retrieve checkout session", lambda: client().v1.checkout.sessions.retrieve(session_id)))


# The Idempotency-Key of the expire call a customer's cancel makes. Stripe copies a request's key
# into the events it causes (`event.request.idempotency_key`), so the `checkout.session.expired`
# notice of that expiry says it was the cancel's own doing, whichever of the two commits first.
CANCEL_EXPIRY_KEY_PREFIX = "backstop-cancel-"


def expire_session(session_id: str, *, cancelling_order: int | None = None) -> SessionView:
    options = {}
    if cancelling_order is not None:
        options["idempotency_key"] = f"{CANCEL_EXPIRY_KEY_PREFIX}order-{cancelling_order}-session-{session_id}"
    return session_view(
        _call("expire checkout session", lambda: client().v1.checkout.sessions.expire(session_id, options=options))
    )


def expired_by_a_cancel(event: dict) -> bool:
    """Was this event caused by the expire call of a customer's cancel (see CANCEL_EXPIRY_KEY_PREFIX)?"""
    request = event.get("request")
    key = request.get("idempotency_key") if isinstance(request, dict) else None
    return isinstance(key, str) and key.startswith(CANCEL_EXPIRY_KEY_PREFIX)


# What happens to a Checkout Session, as events (the types the bulk reconciliation lists).
SESSION_EVENT_TYPES = (
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
)
EVENTS_PAGE_SIZE = 100  # the most one list call returns


@dataclass(frozen=True)
class SessionEvent:
    """One event about a Checkout Session, as the events list gives it: the session as it was then."""

    id: str
    type: str
    created: int
    view: SessionView
    expired_by_cancel: bool

    @property
    def failed(self) -> bool:
        return self.type == "checkout.session.async_payment_failed"


def session_events(*, since: datetime, starting_after: str | None = None) -> tuple[list[SessionEvent], bool]:
    """One page of the provider's Checkout Session events created since `since`, newest first,
    after the event `starting_after` (the last of the previous page); and whether more follow.
    The provider keeps events for 30 days."""
    params = {"types": list(SESSION_EVENT_TYPES), "created": {"gte": int(since.timestamp())}, "limit": EVENTS_PAGE_SIZE}
    if starting_after:
        params["starting_after"] = starting_after
    page = _call("list events", lambda: client().v1.events.list(params=params))
    found = []
    for event in page.data:
        data = event.to_dict() if hasattr(event, "to_dict") else dict(event)
        obj = (data.get("data") or {}).get("object")
        if isinstance(obj, dict) and isinstance(data.get("id"), str):
            found.append(
                SessionEvent(
                    data["id"],
                    str(data.get("type")),
                    int(data.get("created") or 0),
                    session_view(obj),
                    expired_by_a_cancel(data),
                )
            )
    return found, bool(page.has_more)


def create_refund(
    *, order_id: int, session_id: str, payment_intent: str, amount: int, reason: str, attempt: int = 1
) -> RefundView:
    """One refund at the provider per (order, session, attempt): a retry of the same attempt is
    replayed, a new attempt (after the last one failed) refunds again. The first attempt keeps
    the key and metadata refunds had before attempts existed, so a command re-run across a
    deploy is still a replay and not an idempotency error."""
    key = f"backstop-refund-order-{order_id}-session-{session_id}"
    metadata = {"order_id": str(order_id), "session_id": session_id, "reason": reason}
    if attempt > 1:
        key += f"-attempt-{attempt}"
        metadata["attempt"] = str(attempt)
    refund = _call(
        "create refund",
        lambda: client().v1.refunds.create(
            params={"payment_intent": payment_intent, "amount": amount, "metadata": metadata},
            options={"idempotency_key": key},
        ),
    )
    return refund_view(refund)


def retrieve_refund(refund_id: str) -> RefundView:
    return refund_view(_call("retrieve refund", lambda: client().v1.refunds.retrieve(refund_id)))


def verify_webhook(payload: bytes, signature: str | None, secret: str) -> dict:
    """Verify the signature on the raw body and return the event as a plain dict.

    The SDK's own check (`verify_header`: HMAC, scheme, timestamp tolerance), then one parse.
    `construct_event` runs that same check but also parses the body a second time and builds a
    stripe Event object that nothing here uses; on a hot webhook that was most of the cost of
    verifying. Raises SignatureProblem, or ValueError (UnicodeDecodeError included) for a body
    that is not a JSON object."""
    text = payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else payload
    try:
        stripe.WebhookSignature.verify_header(text, signature, secret, stripe.Webhook.DEFAULT_TOLERANCE)
    except stripe.SignatureVerificationError as exc:
        raise SignatureProblem(str(exc)) from exc
    try:
        event = json.loads(text)
    except RecursionError as exc:  # signed, but nested deeper than the parser goes
        raise ValueError("nested too deeply") from exc
    # construct_event refuses these too: signed JSON that is not an object (`[1, 2]`), and a
    # thin v2 notification sent to an endpoint that expects snapshot events.
    if not isinstance(event, dict):
        raise ValueError("not a JSON object")
    if event.get("object") == "v2.core.event":
        raise ValueError("a thin event notification, not a snapshot event")
    return event


# Webhook endpoint registration -------------------------------------------------------------


@dataclass(frozen=True)
class EndpointView:
    id: str
    url: str
    status: str
    description: str | None
    secret: str | None = None
    enabled_events: tuple[str, ...] = ()


def _endpoint(obj) -> EndpointView:
    data = obj.to_dict() if hasattr(obj, "to_dict") else obj
    return EndpointView(
        data["id"],
        data.get("url"),
        data.get("status"),
        data.get("description"),
        data.get("secret"),
        tuple(data.get("enabled_events") or ()),
    )


def list_webhook_endpoints() -> list[EndpointView]:
    page = _call("list webhook endpoints", lambda: client().v1.webhook_endpoints.list(params={"limit": 100}))
    return [_endpoint(e) for e in page.auto_paging_iter()]


def create_webhook_endpoint(url: str, description: str) -> EndpointView:
    return _endpoint(
        _call(
            "create webhook endpoint",
            lambda: client().v1.webhook_endpoints.create(
                params={"url": url, "enabled_events": EVENT_TYPES, "description": description}
            ),
        )
    )


def subscribe_webhook_endpoint(endpoint_id: str) -> EndpointView:
    """Our endpoint, registered by an earlier release, made to send every event this one uses."""
    return _endpoint(
        _call(
            "update webhook endpoint",
            lambda: client().v1.webhook_endpoints.update(endpoint_id, params={"enabled_events": EVENT_TYPES}),
        )
    )


def delete_webhook_endpoint(endpoint_id: str) -> None:
    _call("delete webhook endpoint", lambda: client().v1.webhook_endpoints.delete(endpoint_id))


def payment_intent_failed(payment_intent_id: str) -> bool:
    intent = _call("retrieve payment intent", lambda: client().v1.payment_intents.retrieve(payment_intent_id))
    return intent["status"] in ("requires_payment_method", "canceled")
