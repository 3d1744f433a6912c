"""What stands between the shop and the payment provider: a bulkhead, a circuit breaker and a
rate budget, applied where the gateway calls the SDK (docs/REFERENCE.md, Settings; the layout is
in docs/ARCHITECTURE.md, "Provider calls").

Why: every checkout calls the provider inside the customer's request. A slow provider would
otherwise hold every web thread (the storefront, the console, the webhook and /healthz stop
answering), a dead one would make each customer wait out the SDK's timeouts and retries, and
every process together could spend more than the account's API rate.

- Bulkhead (per process, bulkhead.py): at most STRIPE_MAX_CONCURRENT_CALLS calls in flight.
- Breaker (shared in Redis, breaker.py; its one shop-wide probe, probe.py): after
  BREAKER_THRESHOLD failures in a row no customer's or worker's call is made until a probe finds
  the provider answering again.
- Budget (shared in Redis, budget.py): the account's token bucket and each endpoint's window;
  customers may take the last of them, background work leaves a reserve. While orders wait in
  line for a payment session (payments.checkout_queue), a customer's new session is not created
  ahead of them (line.py).
- Time budget (calls.py): a customer's request gets short timeouts, one SDK retry and an overall
  deadline (the gateway's transport reads it for every attempt); any other web request (the
  console) keeps the background timeouts and retries but the same deadline.

While Redis cannot be reached, each process keeps to its own view (local.py, shared.py).

Who is calling is a context variable (calls.py): background unless the caller says otherwise (a
customer's blueprint with `request_priority`, `customer_call`, `queue_call`). Every refusal is
`Shed`, with the kind of refusal, which the gateway turns into ProviderUnavailable: the caller's
"provider down" path (checkout keeps the order and offers "Pay now", or puts it in line when only
the budget or the bulkhead refused; background work is retried later).
"""

from __future__ import annotations

from flask import current_app

from ...extensions import per_app
from .breaker import PROBE_SPACING_SECONDS, Breaker, BreakerState, ProbeTurn
from .budget import _BUCKET_TAKE, Budget, Grant, Held
from .bulkhead import Bulkhead
from .calls import (
    CallContext,
    Priority,
    background_call,
    current,
    customer_call,
    init_app,
    patient_until,
    queue_call,
    request_priority,
)
from .limits import GRANT_FRESH_SECONDS, Limits, limits_from
from .line import Line
from .local import _LocalState
from .probe import Prober
from .refusals import Shed, ShedKind
from .shared import SharedRedis
from .turns import Ticket, Turnstile

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN

__all__ = [
    "CLOSED",
    "GRANT_FRESH_SECONDS",
    "HALF_OPEN",
    "OPEN",
    "PROBE_SPACING_SECONDS",
    "_BUCKET_TAKE",
    "BreakerState",
    "CallContext",
    "Grant",
    "Held",
    "Limits",
    "Priority",
    "ProbeTurn",
    "ProviderGuard",
    "Shed",
    "ShedKind",
    "Ticket",
    "Turnstile",
    "_LocalState",
    "current",
    "background_call",
    "customer_call",
    "get",
    "init_app",
    "limits_from",
    "patient_until",
    "queue_call",
    "request_priority",
]


class ProviderGuard:
    """One per app (so per process): the bulkhead and the prober thread are this process's, the
    rest is shared. Each part is its own module; this is the one object callers hold."""

    def __init__(self, limits: Limits, redis_url: str | None, prefix: str):
        self.limits = limits
        self.shared = SharedRedis(redis_url)
        self.local = _LocalState()
        self.bucket_key = f"{prefix}:provider:bucket"
        self.line = Line(self.shared, f"{prefix}:provider:line")
        self.breaker = Breaker(limits, self.shared, self.local, f"{prefix}:provider:breaker")
        self.prober = Prober(self.breaker)
        self.bulkhead = Bulkhead(limits)
        self.budget = Budget(
            limits, self.shared, self.local, self.line, self.bucket_key, f"{prefix}:provider:endpoint:"
        )

    # Redis: the tests point the guard at a Redis that is not there, and run a script directly.
    @property
    def _redis_url(self) -> str | None:
        return self.shared.redis_url

    @_redis_url.setter
    def _redis_url(self, url: str | None) -> None:
        self.shared.redis_url = url

    def _run(self, name: str, source: str, keys, args):
        return self.shared.run(name, source, keys, args)

    # Breaker and prober

    def admit(self) -> None:
        self.breaker.admit()

    def record(self, ok: bool) -> BreakerState:
        return self.breaker.record(ok)

    def claim_probe(self) -> ProbeTurn:
        return self.breaker.claim_probe()

    def probe_result(self, ok: bool) -> BreakerState:
        return self.breaker.probe_result(ok)

    def breaker_view(self) -> dict:
        return self.breaker.view()

    def watch_for_recovery(self, app, probe, on_recovered=None) -> None:
        self.prober.watch_for_recovery(app, probe, on_recovered)

    def close(self) -> None:
        self.prober.close()

    # Bulkhead, budget and line

    def slot(self, wait: float | None = None):
        return self.bulkhead.slot(wait)

    def take_token(self, endpoint: str = "", *, behind_line: bool = False) -> Grant:
        return self.budget.take_token(endpoint, behind_line=behind_line)

    def confirm(self, grant: Grant) -> Grant:
        return self.budget.confirm(grant)

    def pause(self, seconds: float) -> None:
        self.budget.pause(seconds)

    def line_seen_held(self) -> bool:
        return self.line.seen_held()

    def hold_line(self, seconds: float) -> None:
        self.line.hold(seconds)

    def open_line(self) -> None:
        self.line.open()


def get() -> ProviderGuard:
    cfg = current_app.config
    return per_app("provider_guard", lambda: ProviderGuard(limits_from(cfg), cfg.get("REDIS_URL"), cfg["QUEUE_PREFIX"]))
