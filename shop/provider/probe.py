"""Asking the provider once, outside the breaker: the breaker's probe (a cheap read whose first
success closes it, then wakes the work that waited for the provider with what create_app handed
in: `init_app`), the console's watch of that same read (`check`), and the deploy preflight's read
of the webhook endpoints (`list_webhook_endpoints_once`, within its own timeout and outside the
guard). Like gateway.py and transport.py, it talks to Stripe's SDK."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import cast

import stripe
from flask import Flask, current_app
from werkzeug.local import LocalProxy

from ..domain.deadlines import utcnow
from ..extensions import db, per_app
from . import guard
from .errors import ProviderFailure, ProviderRefused, unavailable
from .transport import SANDBOX_API_KEY, STRIPE_API, _http_client, api_base
from .views import EndpointView, endpoint_view

log = logging.getLogger("shop.payments")

# Where the app keeps what wakes the work waiting for the provider (see init_app).
_WAKE_WAITING_WORK = "provider_wake_waiting_work"


def init_app(app: Flask, wake_waiting_work: Callable[[datetime], object]) -> None:
    """The app factory hands in what makes the work that backed off for the provider due again
    (outbox.dispatch.wake_provider_waiters), as it hands the outbox its handlers: the provider
    imports no layer that uses it, so it never names the outbox's rows or the use cases."""
    app.extensions[_WAKE_WAITING_WORK] = wake_waiting_work


def counts_as_failure(exc: stripe.StripeError) -> bool:
    """A failure of the provider (the breaker counts it), not a refusal of this one request."""
    status = getattr(exc, "http_status", None) or 0
    return isinstance(exc, (stripe.APIConnectionError, stripe.RateLimitError)) or status >= 500 or status in (0, 429)


# The probe's own time: it must not hold its claim (guard: STRIPE_BREAKER_PROBE_SECONDS) or the
# next probe for long when the provider hangs.
PROBE_TIMEOUT_SECONDS = 2.0


def watch_for_recovery(provider_guard: guard.ProviderGuard) -> None:
    app = cast("LocalProxy[Flask]", current_app)._get_current_object()  # the app, not its proxy
    provider_guard.watch_for_recovery(app, probe, on_recovered=recovered)


def probe() -> bool | None:
    """The shop's one probe while the breaker is open: a cheap read (the newest event, at most
    one), outside the breaker (it is what closes it) but inside this process's bulkhead and the
    rate budget. True when the provider answered (even a refusal of this request is an answer),
    False when it failed, None when there was no slot or budget to try now."""
    return check()[0]


def check() -> tuple[bool | None, str]:
    """The probe's read, with what happened in words (for the console's provider card): the
    provider answered (True), failed (False: its status and message, or the connection's
    error), or there was no slot or budget to ask (None)."""
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
    except guard.Shed as exc:
        return None, str(exc)
    except stripe.StripeError as exc:
        status = getattr(exc, "http_status", None)
        code = getattr(exc, "code", None)
        words = (f"{status} " if status else "") + (f"({code}) " if code else "") + (exc.user_message or str(exc))
        if not counts_as_failure(exc):
            return True, f"answered, refusing the read: {words.strip()}"
        return False, words.strip()[:500]
    return True, "answered"


def recovered() -> None:
    """The probe closed the breaker: work that backed off for the provider (refunds, deadlines
    asking about a session) runs now, not at its next retry up to minutes away."""
    try:
        wake = current_app.extensions.get(_WAKE_WAITING_WORK)
        if wake is None:
            raise RuntimeError("nothing to wake was handed to the provider; build the app with shop.create_app")
        wake(utcnow())
    except Exception:  # noqa: BLE001 - the sweep wakes them at its next cycle too
        log.exception("could not wake the work that waited for the provider")
    finally:
        db.session.remove()


def list_webhook_endpoints_once(timeout_seconds: float) -> list[EndpointView]:
    """The deploy preflight's call (`flask shop check`): the same list registration reads, asked
    once (no retry) and within `timeout_seconds`, outside the guard: a deploy asks whether the
    provider answers this key, whatever the running shop's breaker or rate budget say, and a
    provider that does not answer must not hold the deploy up. ProviderUnavailable when it did
    not answer (or answered 5xx/429), ProviderRefused when it said no (a key it does not know:
    401; a restricted key without this permission: 403)."""
    base = api_base()
    transport = stripe.RequestsClient(timeout=timeout_seconds)
    preflight = stripe.StripeClient(
        current_app.config.get("STRIPE_SECRET_KEY") or SANDBOX_API_KEY,
        base_addresses={"api": base} if base else None,
        max_network_retries=0,
        http_client=transport,
    )
    try:
        page = preflight.v1.webhook_endpoints.list(params={"limit": 100})
        return [endpoint_view(e) for e in page.auto_paging_iter()]
    except stripe.APIConnectionError as exc:
        # The SDK's words are a paragraph of advice; the network's own error is what to act on.
        said = str(exc.user_message or exc)
        network = said.partition("(Network error: ")[2].rstrip(")").strip() or said
        # urllib3 wraps the reason in its retries and pools: keep the reason itself.
        reason = re.search(r"\[Errno -?\d+\][^'\")]*|Read timed out|timed out", network)
        raise unavailable(reason.group(0).strip() if reason else network, None, ProviderFailure.UNREACHABLE) from exc
    except stripe.StripeError as exc:
        status = getattr(exc, "http_status", None) or 0
        if status >= 500 or status in (0, 429):
            kind = ProviderFailure.RATE_LIMITED if status == 429 else ProviderFailure.UNREACHABLE
            raise unavailable(f"error {status}: {exc.user_message or exc}", None, kind) from exc
        raise ProviderRefused(f"{status}: {exc.user_message or exc}", getattr(exc, "code", None)) from exc
    finally:
        transport.close()
