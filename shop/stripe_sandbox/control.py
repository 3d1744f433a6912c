"""The /_sandbox control routes: script payment outcomes, faults and the clock.

These are the sandbox's own API, not Stripe's: JSON in, JSON out, no API key. A refusal is
`{"error": {"type": "sandbox_error", "message": ...}}` with 400 (bad input), 404 (unknown
session or refund) or 409 (the session or refund is in the wrong state); never a 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

from flask import Blueprint, Response, current_app, g, request

from .account import ACCOUNT_FIELDS, AccountError, read_changes
from .api import endpoint
from .objects import render_delivery, render_event, render_refund, render_session
from .state import (
    ADDRESS_FIELDS,
    ASYNC_RESULTS,
    OUTCOMES,
    REFUND_OUTCOMES,
    SHIPPING_FIELD_MAX,
    TEST_SHIPPING_NAME,
    ControlError,
    Faults,
    Sandbox,
    sandbox_shipping_details,
    shipping_problems,
)
from .traffic import MAX_API_HOLD_SECONDS

bp = Blueprint("stripe_sandbox_control", __name__, url_prefix="/_sandbox")

FAULT_TYPES = {
    "drop_webhooks": "count",
    "duplicate_webhooks": "bool",
    "reorder_webhooks": "bool",
    "webhook_delay_seconds": "seconds",
    "refunds_pending": "bool",
    "checkout_url_null": "bool",
    "api_unavailable": "bool",
    "api_latency_seconds": "api_seconds",
    "api_latency_jitter_seconds": "api_seconds",
    "api_hang": "bool",
    "api_rate_limit_per_second": "rate",
    "api_endpoint_rate_limit_per_second": "rate",
    "api_rate_limit_next_calls": "count",
    "lock_timeout": "count",
}


# Past these, a clock or a delay stops meaning anything (and 1e308 seconds overflows every date):
# a year of clock in one step, a day of webhook delay (Stripe retries for about three).
MAX_CLOCK_ADVANCE_SECONDS = 366 * 24 * 3600
MAX_DELAY_SECONDS = 24 * 3600
# No /v1 call is held longer than this in any case (traffic.py), so a larger latency would lie.
MAX_API_LATENCY_SECONDS = int(MAX_API_HOLD_SECONDS)
# Far above any real provider's limit; beyond it the limit could never be reached on loopback.
MAX_RATE_LIMIT_PER_SECOND = 100_000

_LOG_ENTRY = "stripe_sandbox_log_entry"


def log_api_request() -> None:
    """before_request hook: log every /v1 call on arrival (before any fault holds or refuses
    it), so a test can count and time the provider calls a client made (GET /_sandbox/requests)."""
    if request.path.startswith("/v1"):
        entry = _sandbox().request_log.record(
            request.method, request.path, request.headers.get("Idempotency-Key"), endpoint()
        )
        setattr(g, _LOG_ENTRY, entry)


def log_api_answer(response: Response) -> Response:
    """after_request hook: the status each logged /v1 call was answered with."""
    entry = g.get(_LOG_ENTRY)
    if entry is not None:
        _sandbox().request_log.finish(entry, response.status_code)
    return response


def _sandbox() -> Sandbox:
    return current_app.extensions["stripe_sandbox"]


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, indent=2), status=status, mimetype="application/json")


@bp.errorhandler(ControlError)
def _refused(error: ControlError) -> Response:
    return _json({"error": {"type": "sandbox_error", "message": error.message}}, error.status)


def _body(*, required: tuple[str, ...] = (), allowed: tuple[str, ...] = ()) -> dict:
    raw = request.get_data(cache=True)
    if not raw.strip():
        data: Any = {}
    else:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ControlError(400, "The request body must be a JSON object.") from None
    if not isinstance(data, dict):
        raise ControlError(400, "The request body must be a JSON object.")
    for key in required:
        if key not in data:
            raise ControlError(400, f"Missing field: {key}")
    expected = allowed or required
    unknown = sorted(set(data) - set(expected))
    if unknown:
        hint = f"expected any of {', '.join(expected)}" if expected else "this route takes none"
        raise ControlError(400, f"Unknown field(s): {', '.join(unknown)}; {hint}")
    return data


@bp.post("/sessions/<session_id>/outcome")
def set_outcome(session_id: str) -> Response:
    """Same effect as the hosted page's buttons: paid, declined or async_pending. A session that
    collects a shipping address takes `shipping_address` ({"name", "line1", "line2", "city",
    "postal_code", "state", "country"}, as the hosted page's form), else ships to `address` (the
    customer's: {"country", "line1", "line2", "city", "postal_code", "state"}, which tax and
    Adaptive Pricing also use), else to the sandbox's test address."""
    body = _body(required=("outcome",), allowed=("outcome", "shipping_address", "address"))
    outcome = body["outcome"]
    if outcome not in OUTCOMES:
        raise ControlError(400, f"outcome must be one of {', '.join(OUTCOMES)}; got {outcome!r}")
    given = body.get("shipping_address")
    if given is not None and not isinstance(given, dict):
        raise ControlError(400, "shipping_address must be a JSON object.")
    address = _address(body.get("address"))
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.tick()
        details = None
        session = sandbox.sessions.get(session_id)
        if session is None:
            raise ControlError(404, f"No such checkout.session: '{session_id}'")
        if given is not None and not session.collects_shipping:
            raise ControlError(400, "This session does not collect a shipping address.")
        if given is None and address is not None and session.collects_shipping:
            given = _shipping_to(address)
        if given is not None:
            details, problems = shipping_problems(session, given)
            if problems:
                raise ControlError(400, " ".join(problems.values()))
        return _json(render_session(sandbox.apply_outcome(session_id, outcome, details, address)))


def _address(given: Any) -> dict | None:
    """The customer's address in Stripe's shape (all six fields, absent ones null): a country in
    two capital letters is required, the rest are optional strings."""
    if given is None:
        return None
    if not isinstance(given, dict):
        raise ControlError(400, "address must be a JSON object.")
    unknown = sorted(set(given) - set(ADDRESS_FIELDS))
    if unknown:
        raise ControlError(
            400, f"Unknown address field(s): {', '.join(unknown)}; expected any of {', '.join(ADDRESS_FIELDS)}"
        )
    for key, value in given.items():
        if value is not None and (not isinstance(value, str) or len(value) > SHIPPING_FIELD_MAX):
            raise ControlError(400, f"address.{key} must be a string of at most {SHIPPING_FIELD_MAX} characters.")
    country = given.get("country")
    if not isinstance(country, str) or len(country) != 2 or not country.isalpha() or not country.isascii():
        raise ControlError(400, f"address.country must be a two-letter country code such as DE; got {country!r}")
    address = {key: (given.get(key) or "").strip() or None for key in ADDRESS_FIELDS}
    address["country"] = country.upper()
    return address


def _shipping_to(address: dict) -> dict:
    """A collecting session given only the customer's address ships there, to the sandbox's test
    customer, with the test address's fields where the address has none."""
    fallback = sandbox_shipping_details(address["country"])["address"]
    fields = {key: address.get(key) or fallback.get(key) for key in ADDRESS_FIELDS}
    return {**{key: value or "" for key, value in fields.items()}, "name": TEST_SHIPPING_NAME}


@bp.post("/sessions/<session_id>/async")
def settle_async(session_id: str) -> Response:
    """Settle an async_pending payment now: succeeded or failed."""
    result = _body(required=("result",))["result"]
    if result not in ASYNC_RESULTS:
        raise ControlError(400, f"result must be one of {', '.join(ASYNC_RESULTS)}; got {result!r}")
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.tick()
        return _json(render_session(sandbox.settle_async(session_id, result)))


@bp.post("/refunds/<refund_id>/outcome")
def settle_refund(refund_id: str) -> Response:
    """Settle a pending refund (see the `refunds_pending` fault): succeeded or failed, with
    Stripe's events."""
    outcome = _body(required=("outcome",))["outcome"]
    if outcome not in REFUND_OUTCOMES:
        raise ControlError(400, f"outcome must be one of {', '.join(REFUND_OUTCOMES)}; got {outcome!r}")
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.tick()
        return _json(render_refund(sandbox.settle_refund(refund_id, outcome)))


@bp.get("/faults")
def get_faults() -> Response:
    return _json(_sandbox().faults.as_dict())


@bp.post("/faults")
def set_faults() -> Response:
    """Change any subset of the faults; the rest keep their current values."""
    data = _body(allowed=tuple(FAULT_TYPES))
    changes = {key: _fault_value(key, value) for key, value in data.items()}
    sandbox = _sandbox()
    with sandbox.lock:
        return _json(sandbox.set_faults(changes).as_dict())


def _fault_value(key: str, value: Any) -> Any:
    kind = FAULT_TYPES[key]
    if value is None:  # null switches a fault off, like 0 or false
        return getattr(Faults(), key)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ControlError(400, f"{key} must be true or false; got {value!r}")
        return value
    if kind in ("count", "rate"):
        top = MAX_RATE_LIMIT_PER_SECOND if kind == "rate" else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (top is not None and value > top):
            bounds = f"from 0 to {top}" if top is not None else ">= 0"
            raise ControlError(400, f"{key} must be a whole number {bounds}; got {value!r}")
        return value
    top = MAX_API_LATENCY_SECONDS if kind == "api_seconds" else MAX_DELAY_SECONDS
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= top
    ):
        raise ControlError(400, f"{key} must be a number of seconds from 0 to {top}; got {value!r}")
    return float(value)


@bp.get("/account")
def read_account() -> Response:
    return _json(_sandbox().account.as_dict())


@bp.post("/account")
def change_account() -> Response:
    """Change any of the account's settings (account.py); answers all of them."""
    try:
        changes = read_changes(_body(allowed=ACCOUNT_FIELDS))
    except AccountError as error:
        raise ControlError(400, str(error)) from None
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.account.update(changes)
        return _json(sandbox.account.as_dict())


@bp.post("/clock")
def advance_clock() -> Response:
    """Move the sandbox clock forward; sessions due to expire do so before this returns."""
    seconds = _body(required=("advance_seconds",))["advance_seconds"]
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not 0 <= seconds <= MAX_CLOCK_ADVANCE_SECONDS
    ):
        raise ControlError(
            400, f"advance_seconds must be a number from 0 to {MAX_CLOCK_ADVANCE_SECONDS}; got {seconds!r}"
        )
    sandbox = _sandbox()
    now = sandbox.advance_clock(seconds)
    return _json({"now": now, "offset_seconds": sandbox.clock_offset})


@bp.get("/clock")
def read_clock() -> Response:
    sandbox = _sandbox()
    return _json({"now": sandbox.now(), "offset_seconds": sandbox.clock_offset})


@bp.post("/reset")
def reset() -> Response:
    _body()
    _sandbox().reset()
    return _json({"reset": True})


@bp.get("/requests")
def list_requests() -> Response:
    """The /v1 calls since the last reset: `data` counts every method + path exactly, `calls`
    lists the most recent ones (oldest first) with arrival time, Idempotency-Key and status.
    `?since=<epoch seconds>` keeps only the calls that arrived at or after that time."""
    since = request.args.get("since")
    try:
        since_value = None if since is None else float(since)
    except ValueError:
        since_value = math.nan
    if since_value is not None and not math.isfinite(since_value):
        raise ControlError(400, f"since must be a time in epoch seconds; got {since!r}")
    log = _sandbox().request_log
    return _json({"object": "list", "data": log.counts(), "calls": log.calls(since_value)})


@bp.get("/events")
def list_events() -> Response:
    """Every event, oldest first, with each delivery and its attempts."""
    sandbox = _sandbox()
    with sandbox.lock:
        sandbox.tick()
        data = [
            {
                "id": event.id,
                "type": event.type,
                "created": event.created,
                "session": event.session_id,
                "object": event.payload["data"]["object"].get("id"),
                "dropped": event.dropped,
                "event": render_event(event),
                "deliveries": [render_delivery(d) for d in event.deliveries],
            }
            for event in sorted(sandbox.events.values(), key=lambda e: e.seq)
        ]
    return _json({"object": "list", "data": data})
