"""The Stripe sandbox: a Stripe-compatible HTTP server for the demo and the tests.

What it models
  * Checkout Sessions in payment mode with inline `price_data` line items: create, retrieve,
    list (filter `payment_intent`, `status`, `created`), expire. Sessions expire by
    themselves when the sandbox clock reaches `expires_at` (checked on every request and by a
    0.2 s ticker). `expires_at` must lie between now + `min_session_seconds` and now + 24 h.
  * The payment behind a session: a PaymentIntent and a charge created when the customer
    first confirms (pay, decline or pay later), with Stripe's statuses: succeeded,
    processing, requires_payment_method, canceled (a declined intent whose session expired).
  * Refunds of a paid intent or its charge, partial or full, never beyond what was paid.
  * Webhook endpoints (the signing secret appears only in the creation response) and events
    for `checkout.session.completed`, `.async_payment_succeeded`, `.async_payment_failed` and
    `.expired`, each carrying a snapshot of the session, delivered signed exactly as Stripe
    signs and retried with backoff until a 2xx.
  * Stripe's wire behaviour: Bearer/Basic API-key auth, bracketed form params, the error
    envelope and status codes the SDK maps to its exception classes, cursor pagination,
    `expand` of a session's `payment_intent`, and Idempotency-Key replay (byte-for-byte,
    with `Idempotent-Replayed: true`; same key with other params or another endpoint is an
    `idempotency_error`; a request that failed validation saves nothing).
  * A hosted payment page (`/pay/<id>`) and control routes under `/_sandbox` to script the
    same outcomes, inject webhook/API faults, move the clock and reset.
  * The account's Dashboard settings (account.py, `/_sandbox/account`): automatic tax from a
    per-country rate table, Adaptive Pricing at fixed rates, the dynamic payment methods a
    session offers (`payment_method_types` refused on create, as since 2026-09-30.endive),
    voucher expiry and the API version new webhook endpoints record.

What it deliberately does not model
  * Subscriptions, setup mode, Prices/Products/Customers objects, discounts, shipping rates,
    Connect, disputes, payouts, balance transactions, livemode, currencies' minimum charge
    amounts, multiple API versions (objects are always rendered one way, whatever version an
    endpoint records), manual capture.
  * Events other than the four checkout.session ones (no payment_intent.*, charge.*,
    refund.*); refunds are instantly `succeeded`.
  * `/v1/charges` and the line-items endpoint (charges exist only as ids to refund).
  * Persistence, unless started with a state file (`--state-file`, as `flask shop up` does;
    see persist.py): otherwise everything lives in memory and is lost on restart. Faults are
    never kept.

Faults (`POST /_sandbox/faults`) and how they compose
  * `drop_webhooks: N` - the next N events that have at least one subscribed endpoint are
    never delivered to any endpoint (still listed by `GET /v1/events`, as after an outage
    longer than Stripe's retry window).
  * `duplicate_webhooks: true` - every delivery is made twice (independently retried).
  * `reorder_webhooks: true` - events are held back (delivery status `held`) instead of
    sent. Switching it off releases everything held in reverse order of creation, newest
    first, one at a time: each delivery's first attempt finishes before the next begins, so a
    receiver sees e.g. `expired` then `completed`. Retries of a release then run on their own.
  * `webhook_delay_seconds: x` - each delivery's first attempt waits x seconds.
  * `api_unavailable: true` - every /v1 call answers 503 with a Stripe `api_error`.
  * `api_latency_seconds: x`, `api_latency_jitter_seconds: y` - every /v1 call waits x plus a
    uniform 0..y seconds before anything else happens to it.
  * `api_hang: true` - /v1 calls are read and then not answered until the fault is switched
    off (or the sandbox is reset or closed); they then proceed normally.
  * `api_rate_limit_per_second: N` - beyond N /v1 calls admitted within the last second, a
    call answers 429 `rate_limit` with `Stripe-Should-Retry: true` and `Retry-After`.
    `api_endpoint_rate_limit_per_second: N` does the same for each endpoint on its own.
  * `api_rate_limit_next_calls: N` - the next N /v1 calls answer that 429 (`Retry-After: 1`)
    whatever the rates; each one counts it down.
  These three act on /v1 only, never on the hosted page or /_sandbox, and compose in that
  order: a call first waits out its latency and any hang (together never more than 120 s),
  then `api_unavailable` or the rate limit may refuse it. 0, false or null switch a fault off.

Request log (`GET /_sandbox/requests`): exact counts per /v1 method and path, and the last
10,000 /v1 calls with their arrival time (epoch float), Idempotency-Key and answered status.
"""

from __future__ import annotations

import json
import logging
import signal

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import WSGIRequestHandler, make_server

from . import api, control, hosted
from .errors import StripeError
from .state import Sandbox

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 12111


def create_sandbox_app(min_session_seconds: int = 1800, *, start_threads: bool = True) -> Flask:
    """Build the sandbox as a WSGI app, with its delivery and expiry threads running.

    The `Sandbox` behind it is `app.extensions["stripe_sandbox"]`; call its `close()` to stop
    the background threads when the app is thrown away.
    """
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 1_000_000
    app.extensions["stripe_sandbox"] = Sandbox(min_session_seconds, start_threads=start_threads)
    app.before_request(control.log_api_request)
    app.after_request(control.log_api_answer)
    app.register_blueprint(api.bp)
    app.register_blueprint(control.bp)
    app.register_blueprint(hosted.bp)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _crash)
    return app


def _crash(error: Exception) -> Response:
    """A sandbox bug still answers in the caller's language (Stripe's api_error on /v1)."""
    log.exception("stripe sandbox failed on %s %s", request.method, request.path)
    message = f"The Stripe sandbox failed: {type(error).__name__}: {error}"
    if request.path.startswith("/v1"):
        return api.error_response(StripeError(500, message, type="api_error"))
    body = {"error": {"type": "sandbox_error", "message": message}}
    return Response(json.dumps(body), status=500, mimetype="application/json")


def _http_error(error: HTTPException) -> Response:
    """Unknown routes and methods: Stripe's 404 under /v1, JSON under /_sandbox."""
    if request.path.startswith("/v1"):
        if error.code in (404, 405):
            stripe_error = StripeError(
                404,
                f"Unrecognized request URL ({request.method}: {request.path}). Please see "
                "https://stripe.com/docs or we can help at https://support.stripe.com/.",
            )
        else:
            stripe_error = StripeError(error.code or 500, error.description or "Request failed")
        return api.error_response(stripe_error)
    if request.path.startswith("/_sandbox"):
        body = {"error": {"type": "sandbox_error", "message": f"{error.name}: {error.description}"}}
        return Response(json.dumps(body), status=error.code, mimetype="application/json")
    return error.get_response()


class QuietRequestHandler(WSGIRequestHandler):
    """Logs nothing per request (tests and the demo's shared terminal stay readable)."""

    def log_request(self, *args, **kwargs) -> None:  # noqa: D401
        pass


def run(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    min_session_seconds: int = 1800,
    state_file: str | None = None,
    fd: int | None = None,
) -> None:
    """Serve the sandbox until interrupted (threaded werkzeug server). With `state_file`, the
    sandbox starts from it and keeps it up to date, a last time when it stops (SIGTERM too)."""
    app = create_sandbox_app(min_session_seconds)
    sandbox = app.extensions["stripe_sandbox"]
    persisted = None
    if state_file:
        from .persist import StateFile

        persisted = StateFile(sandbox, state_file)
        print(f"Stripe sandbox: {persisted.load()}", flush=True)
        persisted.start()
    server = make_server(host, port, app, threaded=True, request_handler=QuietRequestHandler, fd=fd)
    print(
        f"Stripe sandbox listening on http://{host}:{server.port} "
        f"(STRIPE_API_BASE=http://{host}:{server.port}, min session {min_session_seconds}s)",
        flush=True,
    )
    # SIGTERM (how a supervisor stops it) ends the loop like Ctrl-C, so the state is saved.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        sandbox.close()
        if persisted is not None:
            persisted.close()


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":  # python -m shop.stripe_sandbox.server
    run()
