"""The guard around every SDK call the gateway makes (`guarded_call`): the bulkhead, the breaker,
then the call, whose failures come out as the gateway's errors (shop.provider.errors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import stripe

from . import guard
from .errors import ProviderFailure, ProviderRefused, retry_after_seconds, unavailable
from .probe import counts_as_failure, watch_for_recovery


def guarded_call(what: str, fn: Callable[[], Any]) -> Any:
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
                if provider_guard.record(ok=not counts_as_failure(exc)) is not guard.BreakerState.CLOSED:
                    watch_for_recovery(provider_guard)
                raise
            provider_guard.record(ok=True)
            return result
    except guard.Shed as exc:
        if exc.kind == guard.ShedKind.BREAKER:
            watch_for_recovery(provider_guard)
        raise unavailable(f"{what}: not called: {exc}", exc.retry_after, exc.kind) from exc
    except (stripe.APIConnectionError, stripe.RateLimitError) as exc:
        limited = isinstance(exc, stripe.RateLimitError)
        raise unavailable(
            f"{what}: {exc.user_message or exc}",
            retry_after_seconds(exc.headers) if limited else None,
            ProviderFailure.RATE_LIMITED if limited else ProviderFailure.UNREACHABLE,
        ) from exc
    except stripe.StripeError as exc:
        status = getattr(exc, "http_status", None) or 0
        if status >= 500 or status == 0 or status == 429:
            raise unavailable(
                f"{what}: provider error {status}: {exc.user_message or exc}",
                retry_after_seconds(exc.headers) if status == 429 else None,
                ProviderFailure.RATE_LIMITED if status == 429 else ProviderFailure.UNREACHABLE,
            ) from exc
        raise ProviderRefused(f"{what}: {exc.user_message or exc}", getattr(exc, "code", None)) from exc
