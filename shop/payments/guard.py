"""What stands between the shop and the payment provider: a bulkhead, a circuit breaker and a
rate budget, applied where gateway.py calls the SDK (docs/REFERENCE.md, Settings; the layout is
in docs/ARCHITECTURE.md, "Provider calls").

Why: every checkout calls the provider inside the customer's request. A slow provider would
otherwise hold every web thread (the storefront, the console, the webhook and /healthz stop
answering), a dead one would make each customer wait out the SDK's timeouts and retries, and
every process together could spend more than the account's API rate.

- Bulkhead (per process): at most STRIPE_MAX_CONCURRENT_CALLS calls in flight; a customer's
  call that gets no slot within a short wait is refused, and only a few threads may wait at
  once (Limits.max_waiting; the rest are refused at once), so the other threads stay free.
- Breaker (shared in Redis, in-memory fallback): after BREAKER_THRESHOLD failures in a row it
  opens for a cool-down during which no call is made; then one caller probes and its outcome
  closes or re-opens it.
- Budget (shared in Redis, in-memory fallback): a token bucket of STRIPE_RATE_LIMIT_PER_SECOND.
  Customer calls may take the last token; background calls only while the bucket is above a
  reserve, so the sweep and refunds take what checkout leaves. A 429 pauses everyone until its
  Retry-After.
- Time budget: a customer's request gets short timeouts, one SDK retry and an overall deadline
  (gateway.GuardedHttpClient reads it for every attempt); any other web request (the console)
  keeps the background timeouts and retries but the same deadline.

Who is calling is a context variable, set by the request path (`init_app`) and defaulting to
background, so no call site passes a priority around. Every refusal is `Shed`, which the
gateway turns into ProviderUnavailable: the caller's existing "provider down" path (checkout
keeps the order and offers "Pay now"; background work is retried later).
"""
from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from flask import current_app, g, request
from ..extensions import per_app

log = logging.getLogger("shop.payments.guard")

CUSTOMER = "customer"
BACKGROUND = "background"
# Requests whose provider calls a person (or the provider's own webhook sender) is waiting on.
IN_REQUEST_BLUEPRINTS = ("storefront", "webhooks")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_WORDS = {
    CLOSED: "Reachable: payments start normally.",
    OPEN: "Unavailable: checkout takes orders and holds their stock; customers pay later with “Pay now”.",
    HALF_OPEN: "Recovering: one trial call decides whether payments start normally again.",
}


class Shed(Exception):
    """The guard refused a provider call before it was made (or stopped waiting for it)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class CallContext:
    priority: str
    deadline: float | None = None     # time.monotonic() by which the request must have its answer


_context: contextvars.ContextVar[CallContext] = contextvars.ContextVar(
    "backstop_provider_call_context", default=CallContext(BACKGROUND))


def current() -> CallContext:
    return _context.get()


@contextmanager
def customer_call(budget_seconds: float | None = None):
    """Calls made inside the block are a customer's: priority, short timeouts, a deadline."""
    budget = budget_seconds if budget_seconds is not None else current_app.config["STRIPE_REQUEST_BUDGET_SECONDS"]
    token = _context.set(CallContext(CUSTOMER, time.monotonic() + budget))
    try:
        yield
    finally:
        _context.reset(token)


def init_app(app) -> None:
    """Give every web request the in-request time budget: someone is waiting on the page. The
    storefront's and the webhook's calls are also customer calls (priority in the rate budget,
    short timeouts, one retry). Everything else over HTTP (the console's "Ask the provider
    now") stays background (the SDK's retries, no priority) but within the same deadline, so
    an operator is told "the provider did not answer" in about 10 s and the sweep asks again
    later. Workers, the scheduler and the CLI have no deadline."""

    @app.before_request
    def _enter_request_context():
        deadline = time.monotonic() + app.config["STRIPE_REQUEST_BUDGET_SECONDS"]
        priority = CUSTOMER if request.blueprint in IN_REQUEST_BLUEPRINTS else BACKGROUND
        g._provider_context_token = _context.set(CallContext(priority, deadline))

    @app.teardown_request
    def _leave_request_context(_exc):
        token = g.pop("_provider_context_token", None)
        if token is not None:
            try:
                _context.reset(token)
            except ValueError:  # set in another context (never expected): forget it instead
                _context.set(CallContext(BACKGROUND))


# -- shared state in Redis -----------------------------------------------------------------

# Every time below is Redis's own clock (TIME), never the caller's. A caller's clock read before
# it waited for the GIL, its socket or the script lock is late, and another host's clock may be
# off: with callers' clocks a late caller rewound the token bucket (the next caller was refilled
# for the same interval again), and a process whose clock ran ahead ended another's breaker
# cool-down early.
_REDIS_NOW = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# Breaker: one hash. `admit` says whether a call may go (1), must not (0), or goes as the
# half-open probe (2); `record` applies a call's outcome. Both atomic, so processes that race
# agree on one transition and one probe.
_BREAKER_ADMIT = _REDIS_NOW + """
local k = KEYS[1]
local cooldown, probe_ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HGET', k, 'state') or 'closed'
if state == 'closed' then return {1, state} end
if state == 'open' then
  local opened = tonumber(redis.call('HGET', k, 'opened_at') or '0')
  if now < opened + cooldown then return {0, state} end
  redis.call('HSET', k, 'state', 'half_open', 'probe_until', tostring(now + probe_ttl))
  redis.call('HINCRBY', k, 'to_half_open', 1)
  return {2, 'half_open'}
end
-- half-open: one probe at a time; a probe whose process died is replaced after probe_ttl
local probe_until = tonumber(redis.call('HGET', k, 'probe_until') or '0')
if now >= probe_until then
  redis.call('HSET', k, 'probe_until', tostring(now + probe_ttl))
  return {2, state}
end
return {0, state}
"""
_BREAKER_RECORD = _REDIS_NOW + """
local k = KEYS[1]
local ok, threshold = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HGET', k, 'state') or 'closed'
if ok == 1 then
  redis.call('HSET', k, 'failures', 0)
  if state == 'half_open' then
    redis.call('HSET', k, 'state', 'closed')
    redis.call('HINCRBY', k, 'to_closed', 1)
    return 'closed'
  end
  return state
end
if state == 'open' then return state end
local failures = redis.call('HINCRBY', k, 'failures', 1)
if state == 'half_open' or failures >= threshold then
  redis.call('HSET', k, 'state', 'open', 'opened_at', tostring(now), 'failures', 0)
  redis.call('HINCRBY', k, 'to_open', 1)
  return 'open'
end
return state
"""
# Token bucket: refills at `rate` per second up to `capacity`. A call takes a token if that
# leaves at least `floor` (0 for customers, the reserve for background callers); otherwise the
# reply says how many milliseconds until it could. `paused_until` (a 429's Retry-After) stops
# everyone until then. (With callers' clocks, dozens of busy threads polling let 23 calls a
# second through a budget of 20.)
_BUCKET_TAKE = _REDIS_NOW + """
local k = KEYS[1]
local rate, capacity, floor = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', k, 'tokens', 'at', 'paused_until')
local tokens, at, paused = tonumber(v[1]), tonumber(v[2]), tonumber(v[3] or '0')
if tokens == nil or at == nil then tokens = capacity; at = now end
if now > at then
  tokens = math.min(capacity, tokens + (now - at) * rate)
  at = now
end
redis.call('HSET', k, 'tokens', tostring(tokens), 'at', tostring(at))
redis.call('EXPIRE', k, 3600)
if paused > now then return {0, math.ceil((paused - now) * 1000)} end
if tokens - 1 >= floor then
  redis.call('HSET', k, 'tokens', tostring(tokens - 1))
  return {1, 0}
end
return {0, math.ceil((floor + 1 - tokens) / rate * 1000)}
"""
_BUCKET_PAUSE = _REDIS_NOW + """
local k = KEYS[1]
local until_ = now + tonumber(ARGV[1])
local paused = tonumber(redis.call('HGET', k, 'paused_until') or '0')
if until_ > paused then redis.call('HSET', k, 'paused_until', tostring(until_)) end
redis.call('EXPIRE', k, 3600)
return 1
"""

# A token granted longer ago than this (the caller's thread was held up: the GIL, the scheduler)
# is left unused and another is taken: a late call would arrive at the provider together with
# calls granted after it, and the bucket's margin (Limits.bucket_capacity) covers only this much
# lateness plus the way from here to the provider.
GRANT_FRESH_SECONDS = 0.2

# After Redis fails, this process uses its own view for a while instead of paying a connect
# timeout on every provider call.
REDIS_RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Limits:
    max_concurrent: int
    rate_per_second: int
    breaker_threshold: int
    breaker_cooldown_seconds: float
    customer_wait_seconds: float
    background_wait_seconds: float
    probe_seconds: float
    processes: int = 1                # web processes sharing the budget (WEB_CONCURRENCY)
    threads: int = 0                  # this process's threads (WEB_THREADS); 0: no limit on waiters

    @property
    def max_waiting(self) -> int:
        """How many threads may wait for a bulkhead slot at once; beyond them a call is refused
        without waiting. Waiting threads are threads too: in a brownout, when no slot frees for
        seconds, every checkout past the bulkhead would otherwise hold a thread for its whole
        wait, and the catalog would queue behind them. An eighth of the threads, never the last
        free one."""
        if self.threads <= 0:
            return 1 << 30
        return max(0, min(max(1, self.threads // 8), self.threads - self.max_concurrent - 1))

    @property
    def bucket_capacity(self) -> float:
        # A bucket lets `capacity + refill * L` calls through in any L seconds of its clock
        # (Redis's). Burst 10% and refill 70% of the rate: 80% in any one second by the time
        # calls are granted, and the rest absorbs up to 0.28 s between a grant and the call's
        # arrival at the provider (threads and processes are scheduled late under load, which
        # bunches arrivals; a grant older than GRANT_FRESH_SECONDS is not used), so the provider
        # never counts more than STRIPE_RATE_LIMIT_PER_SECOND in any sliding second.
        return max(1, self.rate_per_second // 10)

    @property
    def refill_per_second(self) -> float:
        return max(1.0, self.rate_per_second * 0.7)

    @property
    def background_reserve(self) -> float:
        # Background calls leave half the burst to customers (with a burst of 1, below 20/s,
        # a reserve would keep them out for good: they compete then).
        return min(self.bucket_capacity / 2, self.bucket_capacity - 1)


class _LocalState:
    """This process's own breaker and bucket: used while Redis cannot be reached."""

    def __init__(self):
        self.lock = threading.Lock()
        self.state, self.failures, self.opened_at, self.probe_until = CLOSED, 0, 0.0, 0.0
        self.transitions = {CLOSED: 0, OPEN: 0, HALF_OPEN: 0}
        self.tokens, self.at, self.paused_until = None, 0.0, 0.0

    def admit(self, now, limits: Limits) -> tuple[int, str]:
        with self.lock:
            if self.state == CLOSED:
                return 1, CLOSED
            if self.state == OPEN:
                if now < self.opened_at + limits.breaker_cooldown_seconds:
                    return 0, OPEN
                self.state, self.probe_until = HALF_OPEN, now + limits.probe_seconds
                self.transitions[HALF_OPEN] += 1
                return 2, HALF_OPEN
            if now >= self.probe_until:
                self.probe_until = now + limits.probe_seconds
                return 2, HALF_OPEN
            return 0, HALF_OPEN

    def record(self, now, ok: bool, limits: Limits) -> str:
        with self.lock:
            if ok:
                self.failures = 0
                if self.state == HALF_OPEN:
                    self.state = CLOSED
                    self.transitions[CLOSED] += 1
                return self.state
            if self.state == OPEN:
                return OPEN
            self.failures += 1
            if self.state == HALF_OPEN or self.failures >= limits.breaker_threshold:
                self.state, self.opened_at, self.failures = OPEN, now, 0
                self.transitions[OPEN] += 1
            return self.state

    def take(self, now, limits: Limits, floor: float) -> float:
        with self.lock:
            # Without Redis this process cannot see what the others spend: it keeps to its share.
            share = limits.processes
            cap, rate = max(1.0, limits.bucket_capacity / share), limits.refill_per_second / share
            floor = min(floor / share, cap - 1)
            # Never back in time: a thread that read the clock before waiting for this lock
            # would rewind `at`, and the next caller would be refilled twice (see _BUCKET_TAKE).
            now = max(now, self.at)
            tokens = cap if self.tokens is None else min(cap, self.tokens + (now - self.at) * rate)
            self.tokens, self.at = tokens, now
            if self.paused_until > now:
                return self.paused_until - now
            if tokens - 1 >= floor:
                self.tokens = tokens - 1
                return 0.0
            return (floor + 1 - tokens) / rate

    def pause(self, until: float) -> None:
        with self.lock:
            self.paused_until = max(self.paused_until, until)

    def view(self) -> dict:
        with self.lock:
            return {"state": self.state, "failures": self.failures, "opened_at": self.opened_at,
                    "transitions": dict(self.transitions)}


class ProviderGuard:
    """One per app (so per process): the bulkhead is this process's, the rest is shared."""

    def __init__(self, limits: Limits, redis_url: str | None, prefix: str):
        self.limits = limits
        self.bulkhead = threading.BoundedSemaphore(limits.max_concurrent)
        self._waiting_lock = threading.Lock()
        self._waiting = 0
        self.local = _LocalState()
        self._redis_url = redis_url
        self._redis = None
        self._redis_down_until = 0.0
        self._scripts: dict = {}
        self.breaker_key = f"{prefix}:provider:breaker"
        self.bucket_key = f"{prefix}:provider:bucket"
        self._last_state = CLOSED

    # Redis, used only while it answers -----------------------------------------------------

    def _run(self, name: str, source: str, keys, args):
        """Run one of the scripts; None when Redis is unreachable (the caller uses its own view)."""
        if self._redis_url is None or time.monotonic() < self._redis_down_until:
            return None
        from redis.exceptions import RedisError

        try:
            if self._redis is None:
                self._redis = _connect(self._redis_url)
            script = self._scripts.get(name)
            if script is None:
                script = self._scripts[name] = self._redis.register_script(source)
            return script(keys=keys, args=args)
        except RedisError as exc:
            log.warning("provider guard: Redis unreachable (%s); this process uses its own view for %.0f s",
                        exc, REDIS_RETRY_SECONDS)
            self._redis_down_until = time.monotonic() + REDIS_RETRY_SECONDS
            return None

    # Breaker --------------------------------------------------------------------------------

    def admit(self) -> bool:
        """May a call go now? Raises Shed while the breaker is open; True for the half-open probe."""
        lim = self.limits
        reply = self._run("admit", _BREAKER_ADMIT, [self.breaker_key], [lim.breaker_cooldown_seconds, lim.probe_seconds])
        verdict, state = (int(reply[0]), _text(reply[1])) if reply is not None else self.local.admit(time.time(), lim)
        self._note(state)
        if verdict == 0:
            raise Shed("the payment provider is failing; calls are paused for a cool-down (circuit breaker "
                       f"{state.replace('_', '-')})", retry_after=lim.breaker_cooldown_seconds)
        return verdict == 2

    def record(self, ok: bool) -> None:
        lim = self.limits
        reply = self._run("record", _BREAKER_RECORD, [self.breaker_key], [1 if ok else 0, lim.breaker_threshold])
        state = _text(reply) if reply is not None else self.local.record(time.time(), ok, lim)
        self._note(state)

    def _note(self, state: str) -> None:
        if state != self._last_state:
            log.warning("provider circuit breaker: %s -> %s", self._last_state, state)
            self._last_state = state

    def breaker_view(self) -> dict:
        """The breaker as every process sees it (Redis), or this process's own view."""
        if self._redis_url is not None and time.monotonic() >= self._redis_down_until:
            from redis.exceptions import RedisError

            try:
                if self._redis is None:
                    self._redis = _connect(self._redis_url)
                raw = {_text(k): _text(v) for k, v in self._redis.hgetall(self.breaker_key).items()}
                return {"state": raw.get("state", CLOSED), "failures": int(raw.get("failures", 0)),
                        "opened_at": float(raw.get("opened_at", 0)), "shared": True,
                        "transitions": {s: int(raw.get(f"to_{s}", 0)) for s in (CLOSED, OPEN, HALF_OPEN)}}
            except RedisError:
                pass
        return {**self.local.view(), "shared": False}

    # Bulkhead and budget ---------------------------------------------------------------------

    @contextmanager
    def slot(self):
        """A place among this process's provider calls in flight, or Shed."""
        wait = self.limits.customer_wait_seconds if current().priority == CUSTOMER \
            else self.limits.background_wait_seconds
        if not self.bulkhead.acquire(blocking=False):
            with self._waiting_lock:
                may_wait = self._waiting < self.limits.max_waiting
                self._waiting += may_wait
            try:
                got = may_wait and self.bulkhead.acquire(timeout=wait)
            finally:
                if may_wait:
                    with self._waiting_lock:
                        self._waiting -= 1
            if not got:
                raise Shed(f"{self.limits.max_concurrent} provider call(s) already in flight in this process "
                           "(STRIPE_MAX_CONCURRENT_CALLS)")
        try:
            yield
        finally:
            self.bulkhead.release()

    def take_token(self) -> None:
        """Spend one unit of the shared rate budget, waiting briefly if one comes soon; else Shed.
        Call it right before the request goes out (gateway's transport does, for every attempt)."""
        lim = self.limits
        ctx = current()
        customer = ctx.priority == CUSTOMER
        floor = 0 if customer else lim.background_reserve
        patience = lim.customer_wait_seconds if customer else lim.background_wait_seconds
        give_up = time.monotonic() + patience
        if ctx.deadline is not None:
            give_up = min(give_up, ctx.deadline)
        while True:
            asked = time.monotonic()
            reply = self._run("take", _BUCKET_TAKE, [self.bucket_key],
                              [lim.refill_per_second, lim.bucket_capacity, floor])
            wait = int(reply[1]) / 1000 if reply is not None else self.local.take(time.time(), lim, floor)
            granted = (int(reply[0]) == 1) if reply is not None else wait == 0.0
            if granted:
                if time.monotonic() - asked <= GRANT_FRESH_SECONDS:
                    return
                # Granted somewhere in [asked, now], too long ago: spent, but not used (see
                # GRANT_FRESH_SECONDS). Ask again at once, within the same patience.
                wait = 0.0
            if time.monotonic() + wait > give_up:
                raise Shed(f"the provider rate budget ({lim.rate_per_second}/s, STRIPE_RATE_LIMIT_PER_SECOND) "
                           f"is spent{'' if customer else ' for background work'}; next call in {wait:.2f} s",
                           retry_after=max(wait, 0.1))
            if wait > 0:
                # Spread the wake-ups: every waiting thread was told the same time.
                time.sleep(max(wait, 0.005) * random.uniform(1.0, 1.5))

    def pause(self, seconds: float) -> None:
        """The provider said 429: nobody calls it again until Retry-After has passed."""
        self.local.pause(time.time() + seconds)
        self._run("pause", _BUCKET_PAUSE, [self.bucket_key], [repr(seconds)])


def _connect(url: str):
    """Redis for the guard. A short connect timeout (a Redis that is down costs a customer 0.25 s
    once, then this process uses its own view for REDIS_RETRY_SECONDS); a longer read timeout,
    because in a web process busy with dozens of threads the answer can wait that long for the
    GIL, and falling back then would let every process spend the whole budget on its own."""
    from redis import Redis

    return Redis.from_url(url, socket_connect_timeout=0.25, socket_timeout=1.0)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def limits_from(cfg) -> Limits:
    return Limits(
        max_concurrent=cfg["STRIPE_MAX_CONCURRENT_CALLS"],
        rate_per_second=cfg["STRIPE_RATE_LIMIT_PER_SECOND"],
        breaker_threshold=cfg["STRIPE_BREAKER_THRESHOLD"],
        breaker_cooldown_seconds=cfg["STRIPE_BREAKER_COOLDOWN_SECONDS"],
        customer_wait_seconds=cfg["STRIPE_CUSTOMER_WAIT_SECONDS"],
        background_wait_seconds=cfg["STRIPE_BACKGROUND_WAIT_SECONDS"],
        probe_seconds=cfg["STRIPE_BREAKER_PROBE_SECONDS"],
        processes=max(1, cfg["WEB_CONCURRENCY"]),
        threads=cfg["WEB_THREADS"],
    )


def get() -> ProviderGuard:
    cfg = current_app.config
    return per_app("provider_guard",
                   lambda: ProviderGuard(limits_from(cfg), cfg.get("REDIS_URL"), cfg["QUEUE_PREFIX"]))
