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
  opens and no customer's or worker's call is made. While it is open, one probe for the whole
  shop (a cheap read, made by a prober thread of whichever process claims it in the breaker's
  own hash, at most one per second; see `Prober`) learns that the provider answers again, and
  its first success closes the breaker for every process. Probes that keep failing back off, up
  to the cool-down. A customer's call is never the probe.
- Budget (shared in Redis, in-memory fallback): a token bucket of STRIPE_RATE_LIMIT_PER_SECOND
  for the whole account, and a sliding one-second window for each endpoint (method + path
  template) of STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND, both taken at once. Customer calls may
  take the last of either; background calls only while a reserve is left, so the sweep and
  refunds take what checkout leaves. A 429 pauses everyone until its Retry-After. While orders
  wait in line for a payment session (payments.checkout_queue), a customer's new session is
  not created ahead of them: the call is refused as `Shed(kind=LINE)` and the order joins the
  line.
- Time budget: a customer's request gets short timeouts, one SDK retry and an overall deadline
  (gateway.GuardedHttpClient reads it for every attempt); any other web request (the console)
  keeps the background timeouts and retries but the same deadline.

Who is calling is a context variable, set by the request path (`init_app`) and defaulting to
background, so no call site passes a priority around. Every refusal is `Shed`, with the kind of
refusal, which the gateway turns into ProviderUnavailable: the caller's "provider down" path
(checkout keeps the order and offers "Pay now", or puts it in line when only the budget or the
bulkhead refused; background work is retried later).
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
from collections import deque
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
    HALF_OPEN: "Recovering: the shop is checking whether the provider answers again; payments start as soon as it "
    "does.",
}


# Why a call was refused (Shed.kind): the provider's budget or this process's slots, which a
# queued order waits out (BUDGET, BULKHEAD, LINE), or the provider being down (BREAKER), or the
# request's own time running out (DEADLINE).
BUDGET, BULKHEAD, LINE, BREAKER, DEADLINE = "budget", "bulkhead", "line", "breaker", "deadline"


class Shed(Exception):
    """The guard refused a provider call before it was made (or stopped waiting for it)."""

    def __init__(self, message: str, retry_after: float | None = None, kind: str = BUDGET):
        super().__init__(message)
        self.retry_after = retry_after
        self.kind = kind


@dataclass(frozen=True)
class CallContext:
    priority: str
    deadline: float | None = None  # time.monotonic() by which the request must have its answer
    # The payment queue's own calls (payments.checkout_queue): a customer's priority and the line's
    # place, but patient: they wait for the budget instead of being refused after a moment, and
    # their first request takes the budget in its turn (the order's place in line).
    in_line: bool = False
    patience: float | None = None
    turn: Ticket | None = None


_context: contextvars.ContextVar[CallContext] = contextvars.ContextVar(
    "backstop_provider_call_context", default=CallContext(BACKGROUND)
)


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


class Turnstile:
    """Lets a process's calls take the rate budget in the order their tickets were issued: the
    payment queue issues them in the line's arrival order, and its calls run on several threads
    at once (the provider's latency), so without turns the budget would go to whichever thread
    asked first. A turn not taken within TURN_PATIENCE_SECONDS is skipped, so a call held up
    before its request (a slow database) delays the others only that long."""

    def __init__(self):
        self._changed = threading.Condition()
        self._issued = 0
        self._serving = 0
        self._finished: set[int] = set()

    def ticket(self) -> Ticket:
        with self._changed:
            number, self._issued = self._issued, self._issued + 1
        return Ticket(self, number)

    def _wait(self, number: int) -> None:
        give_up = time.monotonic() + TURN_PATIENCE_SECONDS
        with self._changed:
            while self._serving < number and time.monotonic() < give_up:
                self._changed.wait(give_up - time.monotonic())

    def _finish(self, number: int) -> None:
        with self._changed:
            self._finished.add(number)
            while self._serving in self._finished:
                self._finished.discard(self._serving)
                self._serving += 1
            self._changed.notify_all()


class Ticket:
    """One call's place in a Turnstile: its first budget request waits for its turn; `release`
    gives the turn up when the call ends without one."""

    def __init__(self, turnstile: Turnstile, number: int):
        self._turnstile, self.number, self.used = turnstile, number, False

    def take(self, take):
        self.used = True
        self._turnstile._wait(self.number)
        try:
            return take()
        finally:
            self._turnstile._finish(self.number)

    def release(self) -> None:
        if not self.used:
            self.used = True
            self._turnstile._finish(self.number)


# After meeting the line held, a process sends its customers' new sessions to it directly for this
# long (see ProviderGuard.line_seen_held); a line that opened meanwhile serves them first anyway.
LINE_SEEN_SECONDS = 0.5
# How long a turn waits for the ones before it (see Turnstile).
TURN_PATIENCE_SECONDS = 2.0


@contextmanager
def queue_call(patience_seconds: float, turn: Ticket | None = None):
    """Calls made inside the block create the session of an order that waited in line: a
    customer's priority in the budget, not held back by the line itself, patient, and (with a
    `turn`) taking the budget in the line's order."""
    token = _context.set(CallContext(CUSTOMER, None, in_line=True, patience=patience_seconds, turn=turn))
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

# Breaker: one hash. `admit` says whether a call may go (1) or not (0): only while closed; a
# customer's call is never the probe. `record` applies a call's outcome: failures in a row open
# it, any success closes it. Atomic, so processes that race agree on one transition.
_BREAKER_ADMIT = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'closed' then return {1, state} end
return {0, state}
"""
_BREAKER_RECORD = (
    _REDIS_NOW
    + """
local k = KEYS[1]
local ok, threshold, first_probe = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HGET', k, 'state') or 'closed'
if ok == 1 then
  redis.call('HSET', k, 'failures', 0)
  if state ~= 'closed' then
    redis.call('HSET', k, 'state', 'closed', 'probe_failures', 0, 'probe_until', 0, 'last_ok_at', tostring(now))
    redis.call('HINCRBY', k, 'to_closed', 1)
    return 'closed'
  end
  return state
end
if state ~= 'closed' then return state end
local failures = redis.call('HINCRBY', k, 'failures', 1)
if failures >= threshold then
  redis.call('HSET', k, 'state', 'open', 'opened_at', tostring(now), 'failures', 0, 'probe_failures', 0,
             'probe_until', 0, 'next_probe_at', tostring(now + first_probe))
  redis.call('HINCRBY', k, 'to_open', 1)
  return 'open'
end
return state
"""
)
# The probe, while the breaker is not closed: `claim` gives it to one caller at a time (1), at
# most once per `spacing` seconds across every process, else says how many milliseconds until
# one may ask again (0). A claim is held for `ttl` seconds, so a prober whose process died is
# replaced. `result` closes the breaker on success; a failure keeps it open and spaces the next
# probe: `spacing` for the first `steady` failures (a blip ends within a second of the provider's
# return), then doubling up to `cap` (the cool-down) while the outage lasts.
_PROBE_CLAIM = (
    _REDIS_NOW
    + """
local k = KEYS[1]
local ttl, spacing = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HGET', k, 'state') or 'closed'
if state == 'closed' then return {0, state, 0} end
local v = redis.call('HMGET', k, 'next_probe_at', 'probe_until')
local due = math.max(tonumber(v[1] or '0'), tonumber(v[2] or '0'))
if now < due then return {0, state, math.ceil((due - now) * 1000)} end
redis.call('HSET', k, 'state', 'half_open', 'probe_until', tostring(now + ttl),
           'next_probe_at', tostring(now + spacing), 'last_probe_at', tostring(now))
if state == 'open' then redis.call('HINCRBY', k, 'to_half_open', 1) end
return {1, 'half_open', 0}
"""
)
_PROBE_RESULT = (
    _REDIS_NOW
    + """
local k = KEYS[1]
local ok, spacing, steady, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HGET', k, 'state') or 'closed'
redis.call('HSET', k, 'last_probe_ok', ok)
if ok == 1 then
  redis.call('HSET', k, 'last_ok_at', tostring(now))
  if state == 'closed' then return state end
  redis.call('HSET', k, 'state', 'closed', 'failures', 0, 'probe_failures', 0, 'probe_until', 0)
  redis.call('HINCRBY', k, 'to_closed', 1)
  return 'closed'
end
if state == 'closed' then return state end
local failed = redis.call('HINCRBY', k, 'probe_failures', 1)
local started = tonumber(redis.call('HGET', k, 'last_probe_at') or tostring(now))
local wait = math.min(cap, spacing * 2 ^ math.max(0, failed - steady))
redis.call('HSET', k, 'state', 'open', 'probe_until', 0, 'next_probe_at', tostring(math.max(started + wait, now)))
if state == 'half_open' then redis.call('HINCRBY', k, 'to_open', 1) end
return 'open'
"""
)
# The rate budget, taken in one step: the account's token bucket (KEYS[1]) refills at `rate`
# per second up to `capacity`, and a call takes a token if that leaves at least `floor` (0 for
# customers, the reserve for background callers); the endpoint's window (KEYS[2], a sorted set of
# grant times, its own limit of `ep_limit` in any `ep_window` seconds less `ep_reserve` for
# background callers) must have room too. Both or neither are taken. Otherwise the reply says
# how many milliseconds until the call could go, and which budget held it. `paused_until` (a
# 429's Retry-After) stops everyone until then; KEYS[3] existing (orders waiting in line for a
# session) refuses the calls that must not pass them (`respect_line`). (With callers' clocks,
# dozens of busy threads polling let 23 calls a second through a budget of 20.)
_BUCKET_TAKE = (
    _REDIS_NOW
    + """
local k, window = KEYS[1], KEYS[2]
local rate, capacity, floor = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ep_limit, ep_window, ep_reserve = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local respect_line = tonumber(ARGV[7])
local v = redis.call('HMGET', k, 'tokens', 'at', 'paused_until')
local tokens, at, paused = tonumber(v[1]), tonumber(v[2]), tonumber(v[3] or '0')
if tokens == nil or at == nil then tokens = capacity; at = now end
if now > at then
  tokens = math.min(capacity, tokens + (now - at) * rate)
  at = now
end
redis.call('HSET', k, 'tokens', tostring(tokens), 'at', tostring(at))
redis.call('EXPIRE', k, 3600)
if paused > now then return {0, math.ceil((paused - now) * 1000), 'paused', ''} end
if respect_line == 1 and redis.call('EXISTS', KEYS[3]) == 1 then return {0, 0, 'line', ''} end
local wait, held = 0, ''
if tokens - 1 < floor then wait, held = (floor + 1 - tokens) / rate, 'account' end
if ep_limit > 0 then
  redis.call('ZREMRANGEBYSCORE', window, '-inf', now - ep_window)
  local used, room = redis.call('ZCARD', window), ep_limit - ep_reserve
  if used >= room then
    local frees = redis.call('ZRANGE', window, used - room, used - room, 'WITHSCORES')
    local ep_wait = tonumber(frees[2]) + ep_window - now
    if ep_wait >= wait then wait, held = ep_wait, 'endpoint' end
  end
end
if held ~= '' then return {0, math.ceil(math.max(wait, 0.001) * 1000), held, ''} end
redis.call('HSET', k, 'tokens', tostring(tokens - 1))
local member = ''
if ep_limit > 0 then
  member = tostring(now) .. ':' .. redis.call('HINCRBY', k, 'grants', 1)
  redis.call('ZADD', window, now, member)
  redis.call('EXPIRE', window, 60)
end
return {1, 0, '', member}
"""
)
# A grant not used after all (it came too late to be sent, see GRANT_FRESH_SECONDS): its token
# and its place in the endpoint's window go back.
_BUCKET_GIVE_BACK = """
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or '0')
redis.call('HSET', KEYS[1], 'tokens', tostring(math.min(tonumber(ARGV[1]), tokens + 1)))
if ARGV[2] ~= '' then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""
_BUCKET_PAUSE = (
    _REDIS_NOW
    + """
local k = KEYS[1]
local until_ = now + tonumber(ARGV[1])
local paused = tonumber(redis.call('HGET', k, 'paused_until') or '0')
if until_ > paused then redis.call('HSET', k, 'paused_until', tostring(until_)) end
redis.call('EXPIRE', k, 3600)
return 1
"""
)
# A token granted longer ago than this (the caller's thread was held up: the GIL, the scheduler)
# is given back unused and another is taken: a late call would arrive at the provider together
# with calls granted after it. The account bucket's margin (Limits.bucket_capacity) and the
# endpoint window's slack (ENDPOINT_WINDOW_SLACK_SECONDS) cover this much lateness plus the way
# from here to the provider.
GRANT_FRESH_SECONDS = 0.1
# Each endpoint's window is this much longer than the provider's second: a call arrives at most
# GRANT_FRESH_SECONDS plus its way to the provider after its grant, so calls granted within any
# 1 + slack seconds cover every second the provider counts, and STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND
# grants in such a window never make more than that many arrivals in one second.
ENDPOINT_WINDOW_SLACK_SECONDS = 0.15

# Probes while the breaker is open: at most one per PROBE_SPACING_SECONDS across every process (a
# little over a second, so that their arrivals at the provider stay a second apart whatever the
# way there takes), at that pace for the first PROBE_STEADY failures (about ten seconds: a blip
# is over within about a second of the provider's return), then doubling up to the cool-down.
# A prober thread asks for the claim this often while it waits.
PROBE_SPACING_SECONDS = 1.1
PROBE_STEADY = 10
PROBE_POLL_SECONDS = 0.2

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
    processes: int = 1  # web processes sharing the budget (WEB_CONCURRENCY)
    threads: int = 0  # this process's threads (WEB_THREADS); 0: no limit on waiters
    endpoint_rate_per_second: int = 0  # STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND; 0: no per-endpoint limit

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

    @property
    def endpoint_window_seconds(self) -> float:
        return 1.0 + ENDPOINT_WINDOW_SLACK_SECONDS

    @property
    def endpoint_reserve(self) -> int:
        """Places in each endpoint's window that background callers leave to customers: a
        tenth (none below 10/s, where a reserve would shut them out)."""
        return self.endpoint_rate_per_second // 10


@dataclass(frozen=True)
class Grant:
    """A unit of the rate budget taken for one request (see ProviderGuard.take_token)."""

    endpoint: str
    member: str = ""  # its place in the endpoint's window ("" without one, or locally)
    local: bool = False  # taken from this process's own view (Redis unreachable)


@dataclass(frozen=True)
class ProbeTurn:
    """What a prober learned from the breaker: whether the breaker is closed (nothing to probe),
    whether this caller holds the probe now, or how long to wait before asking again."""

    closed: bool
    mine: bool = False
    wait: float = 0.0


def probe_interval(failures: int, cap: float) -> float:
    """How far apart probes are after `failures` failed in a row (see _PROBE_RESULT)."""
    return min(cap, PROBE_SPACING_SECONDS * 2 ** max(0, failures - PROBE_STEADY))


class _LocalState:
    """This process's own breaker and budget: used while Redis cannot be reached. The same rules
    as the scripts above, on this process's clock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.state, self.failures, self.opened_at = CLOSED, 0, 0.0
        self.probe_until = self.next_probe_at = self.last_probe_at = 0.0
        self.probe_failures = 0
        self.transitions = {CLOSED: 0, OPEN: 0, HALF_OPEN: 0}
        self.tokens, self.at, self.paused_until = None, 0.0, 0.0
        self.windows: dict[str, deque] = {}

    def admit(self) -> tuple[int, str]:
        with self.lock:
            return (1 if self.state == CLOSED else 0), self.state

    def record(self, now, ok: bool, limits: Limits) -> str:
        with self.lock:
            if ok:
                self.failures = 0
                if self.state != CLOSED:
                    self._close()
                return self.state
            if self.state != CLOSED:
                return self.state
            self.failures += 1
            if self.failures >= limits.breaker_threshold:
                self.state, self.opened_at, self.failures, self.probe_failures = OPEN, now, 0, 0
                self.probe_until, self.next_probe_at = 0.0, now + PROBE_SPACING_SECONDS
                self.transitions[OPEN] += 1
            return self.state

    def _close(self) -> None:
        self.state, self.failures, self.probe_failures, self.probe_until = CLOSED, 0, 0, 0.0
        self.transitions[CLOSED] += 1

    def claim_probe(self, now, limits: Limits) -> ProbeTurn:
        with self.lock:
            if self.state == CLOSED:
                return ProbeTurn(closed=True)
            due = max(self.next_probe_at, self.probe_until)
            if now < due:
                return ProbeTurn(closed=False, wait=due - now)
            if self.state == OPEN:
                self.transitions[HALF_OPEN] += 1
            self.state, self.probe_until = HALF_OPEN, now + limits.probe_seconds
            self.next_probe_at, self.last_probe_at = now + PROBE_SPACING_SECONDS, now
            return ProbeTurn(closed=False, mine=True)

    def probe_result(self, now, ok: bool, limits: Limits) -> str:
        with self.lock:
            if self.state == CLOSED:
                return CLOSED
            if ok:
                self._close()
                return CLOSED
            self.probe_failures += 1
            wait = probe_interval(self.probe_failures, limits.breaker_cooldown_seconds)
            if self.state == HALF_OPEN:
                self.transitions[OPEN] += 1
            self.state, self.probe_until = OPEN, 0.0
            self.next_probe_at = max(self.last_probe_at + wait, now)
            return OPEN

    def take(self, now, limits: Limits, floor: float, endpoint: str, customer: bool) -> tuple[float, str]:
        """(seconds to wait, which budget held it), (0.0, "") when granted."""
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
                return self.paused_until - now, "paused"
            wait, held = ((floor + 1 - tokens) / rate, "account") if tokens - 1 < floor else (0.0, "")
            window = None
            if limits.endpoint_rate_per_second:
                span = limits.endpoint_window_seconds
                window = self.windows.setdefault(endpoint, deque())
                while window and window[0] <= now - span:
                    window.popleft()
                room = max(1, (limits.endpoint_rate_per_second - (0 if customer else limits.endpoint_reserve)) // share)
                if len(window) >= room:
                    ep_wait = window[len(window) - room] + span - now
                    if ep_wait >= wait:
                        wait, held = ep_wait, "endpoint"
            if held:
                return max(wait, 0.001), held
            self.tokens = tokens - 1
            if window is not None:
                window.append(now)
            return 0.0, ""

    def pause(self, until: float) -> None:
        with self.lock:
            self.paused_until = max(self.paused_until, until)

    def view(self) -> dict:
        with self.lock:
            return {
                "state": self.state,
                "failures": self.failures,
                "opened_at": self.opened_at,
                "last_probe_at": self.last_probe_at or None,
                "probe_failures": self.probe_failures,
                "transitions": dict(self.transitions),
            }


class ProviderGuard:
    """One per app (so per process): the bulkhead and the prober thread are this process's, the
    rest is shared."""

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
        self.endpoint_prefix = f"{prefix}:provider:endpoint:"
        self.line_key = f"{prefix}:provider:line"
        self._last_state = CLOSED
        self._line_seen_until = 0.0  # monotonic: this process met the line held until then
        self._prober: threading.Thread | None = None
        self._prober_lock = threading.Lock()
        self._closed = threading.Event()

    # Redis, used only while it answers -----------------------------------------------------

    def _connection(self):
        """The Redis client, or None while Redis is taken to be unreachable."""
        if self._redis_url is None or time.monotonic() < self._redis_down_until:
            return None
        if self._redis is None:
            self._redis = _connect(self._redis_url)
        return self._redis

    def _unreachable(self, exc) -> None:
        log.warning(
            "provider guard: Redis unreachable (%s); this process uses its own view for %.0f s",
            exc,
            REDIS_RETRY_SECONDS,
        )
        self._redis_down_until = time.monotonic() + REDIS_RETRY_SECONDS

    def _run(self, name: str, source: str, keys, args):
        """Run one of the scripts; None when Redis is unreachable (the caller uses its own view)."""
        from redis.exceptions import RedisError

        try:
            conn = self._connection()
            if conn is None:
                return None
            script = self._scripts.get(name)
            if script is None:
                script = self._scripts[name] = conn.register_script(source)
            return script(keys=keys, args=args)
        except RedisError as exc:
            self._unreachable(exc)
            return None

    # Breaker --------------------------------------------------------------------------------

    def admit(self) -> None:
        """May a call go now? Raises Shed unless the breaker is closed (then the prober, not a
        customer's call, finds out when the provider answers again)."""
        reply = self._run("admit", _BREAKER_ADMIT, [self.breaker_key], [])
        verdict, state = (int(reply[0]), _text(reply[1])) if reply is not None else self.local.admit()
        self._note(state)
        if verdict == 0:
            raise Shed(
                "the payment provider is failing; no calls are made until a probe finds it answering "
                f"again (circuit breaker {state.replace('_', '-')})",
                retry_after=PROBE_SPACING_SECONDS,
                kind=BREAKER,
            )

    def record(self, ok: bool) -> str:
        lim = self.limits
        reply = self._run(
            "record",
            _BREAKER_RECORD,
            [self.breaker_key],
            [1 if ok else 0, lim.breaker_threshold, PROBE_SPACING_SECONDS],
        )
        state = _text(reply) if reply is not None else self.local.record(time.time(), ok, lim)
        self._note(state)
        return state

    def claim_probe(self) -> ProbeTurn:
        lim = self.limits
        reply = self._run("claim_probe", _PROBE_CLAIM, [self.breaker_key], [lim.probe_seconds, PROBE_SPACING_SECONDS])
        if reply is None:
            return self.local.claim_probe(time.time(), lim)
        state = _text(reply[1])
        self._note(state)
        return ProbeTurn(closed=state == CLOSED, mine=int(reply[0]) == 1, wait=int(reply[2]) / 1000)

    def probe_result(self, ok: bool) -> str:
        lim = self.limits
        reply = self._run(
            "probe_result",
            _PROBE_RESULT,
            [self.breaker_key],
            [1 if ok else 0, PROBE_SPACING_SECONDS, PROBE_STEADY, lim.breaker_cooldown_seconds],
        )
        state = _text(reply) if reply is not None else self.local.probe_result(time.time(), ok, lim)
        self._note(state)
        return state

    def _note(self, state: str) -> None:
        if state != self._last_state:
            log.warning("provider circuit breaker: %s -> %s", self._last_state, state)
            self._last_state = state

    def breaker_view(self) -> dict:
        """The breaker as every process sees it (Redis), or this process's own view."""
        from redis.exceptions import RedisError

        try:
            conn = self._connection()
            if conn is not None:
                raw = {_text(k): _text(v) for k, v in conn.hgetall(self.breaker_key).items()}
                last_probe = float(raw.get("last_probe_at") or 0)
                return {
                    "state": raw.get("state", CLOSED),
                    "failures": int(raw.get("failures", 0)),
                    "opened_at": float(raw.get("opened_at", 0)),
                    "shared": True,
                    "last_probe_at": last_probe or None,
                    "probe_failures": int(raw.get("probe_failures", 0)),
                    "transitions": {s: int(raw.get(f"to_{s}", 0)) for s in (CLOSED, OPEN, HALF_OPEN)},
                }
        except RedisError:
            pass
        return {**self.local.view(), "shared": False}

    # The prober -------------------------------------------------------------------------------

    def watch_for_recovery(self, app, probe, on_recovered=None) -> None:
        """Make sure this process has a prober thread while the breaker is not closed: it asks
        for the shop's one probe (claim_probe) every PROBE_POLL_SECONDS and, when it holds it,
        calls `probe()` (True: the provider answered; False: it failed; None: could not try)
        inside `app`'s context, then records the result. It ends once the breaker is closed,
        calling `on_recovered()` if its own probe closed it. Cheap to call on every refusal."""
        thread = self._prober
        if thread is not None and thread.is_alive():
            return
        with self._prober_lock:
            if self._prober is not None and self._prober.is_alive():
                return
            self._prober = threading.Thread(
                target=self._probe_until_closed, args=(app, probe, on_recovered), name="provider-prober", daemon=True
            )
            self._prober.start()

    def _probe_until_closed(self, app, probe, on_recovered) -> None:
        with app.app_context():
            while not self._closed.is_set():
                try:
                    turn = self.claim_probe()
                    if turn.closed:
                        return
                    if not turn.mine:
                        self._closed.wait(min(max(turn.wait, 0.02), PROBE_POLL_SECONDS))
                        continue
                    answered = probe()
                    if answered is None:  # no slot or no budget for it now: the claim lapses, ask again
                        self._closed.wait(PROBE_POLL_SECONDS)
                        continue
                    if self.probe_result(answered) == CLOSED and answered:
                        log.warning("payment provider answers again: the circuit breaker is closed for every process")
                        if on_recovered is not None:
                            on_recovered()
                        return
                except Exception:  # noqa: BLE001 - a prober must outlive any one bad round
                    log.exception("provider prober: a round failed; trying again")
                    self._closed.wait(PROBE_SPACING_SECONDS)

    def close(self) -> None:
        """Stop this guard's prober (an app being thrown away: tests)."""
        self._closed.set()

    # Bulkhead and budget ---------------------------------------------------------------------

    @contextmanager
    def slot(self, wait: float | None = None):
        """A place among this process's provider calls in flight, or Shed."""
        if wait is None:
            wait = (
                self.limits.customer_wait_seconds
                if current().priority == CUSTOMER
                else self.limits.background_wait_seconds
            )
        if not self.bulkhead.acquire(blocking=False):
            with self._waiting_lock:
                may_wait = self._waiting < self.limits.max_waiting
                self._waiting += may_wait
            try:
                got = may_wait and wait > 0 and self.bulkhead.acquire(timeout=wait)
            finally:
                if may_wait:
                    with self._waiting_lock:
                        self._waiting -= 1
            if not got:
                raise Shed(
                    f"{self.limits.max_concurrent} provider call(s) already in flight in this process "
                    "(STRIPE_MAX_CONCURRENT_CALLS)",
                    kind=BULKHEAD,
                )
        try:
            yield
        finally:
            self.bulkhead.release()

    def take_token(self, endpoint: str = "", *, behind_line: bool = False) -> Grant:
        """Spend one unit of the shared rate budget for a request to `endpoint` (method + path
        template): the account's and the endpoint's, waiting while one comes soon; else Shed.
        Call it right before the request goes out (the gateway's transport does, for every
        attempt). `behind_line`: the request creates a payment session, which a customer's call
        must not create ahead of orders waiting in line (Shed with kind LINE)."""
        turn = current().turn
        if turn is not None and not turn.used:
            return turn.take(lambda: self._take_token(endpoint, behind_line))
        return self._take_token(endpoint, behind_line)

    def _take_token(self, endpoint: str, behind_line: bool) -> Grant:
        lim = self.limits
        ctx = current()
        customer = ctx.priority == CUSTOMER
        floor = 0 if customer else lim.background_reserve
        if ctx.patience is not None:
            patience = ctx.patience
        else:
            patience = lim.customer_wait_seconds if customer else lim.background_wait_seconds
        give_up = time.monotonic() + patience
        if ctx.deadline is not None:
            give_up = min(give_up, ctx.deadline)
        respect_line = 1 if behind_line and customer and not ctx.in_line else 0
        limit = lim.endpoint_rate_per_second if endpoint else 0
        keys = [self.bucket_key, self.endpoint_prefix + endpoint, self.line_key]
        while True:
            asked = time.monotonic()
            reply = self._run(
                "take",
                _BUCKET_TAKE,
                keys,
                [
                    lim.refill_per_second,
                    lim.bucket_capacity,
                    floor,
                    limit,
                    lim.endpoint_window_seconds,
                    0 if customer else lim.endpoint_reserve,
                    respect_line,
                ],
            )
            if reply is not None:
                granted, wait, held = int(reply[0]) == 1, int(reply[1]) / 1000, _text(reply[2])
                grant = Grant(endpoint, _text(reply[3]))
            else:
                wait, held = self.local.take(time.time(), lim, floor, endpoint, customer)
                granted, grant = held == "", Grant(endpoint, local=True)
            if held == "line":
                self._line_seen_until = time.monotonic() + LINE_SEEN_SECONDS
                raise Shed("customers are waiting in line for a payment session; this one joins them", kind=LINE)
            if granted:
                if time.monotonic() - asked <= GRANT_FRESH_SECONDS:
                    return grant
                # Granted somewhere in [asked, now], too long ago to be sent with the calls
                # granted after it (see GRANT_FRESH_SECONDS): given back, and asked again at once,
                # within the same patience.
                self._give_back(grant)
                wait = 0.0
            if time.monotonic() + wait > give_up:
                raise Shed(self._spent(held, endpoint, wait, customer), retry_after=max(wait, 0.1), kind=BUDGET)
            if wait > 0:
                # Spread the wake-ups: every waiting thread was told the same time. A call that
                # holds its turn (the payment queue's) is the only one waiting: it wakes on time.
                spread = 1.0 if ctx.turn is not None else random.uniform(1.0, 1.5)
                time.sleep(max(wait, 0.002) * spread)

    def _spent(self, held: str, endpoint: str, wait: float, customer: bool) -> str:
        lim = self.limits
        if held == "endpoint":
            budget = (
                f"the provider budget for {endpoint} ({lim.endpoint_rate_per_second}/s, "
                "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND)"
            )
        elif held == "paused":
            budget = "the provider rate budget (paused by the provider's 429 until its Retry-After)"
        else:
            budget = f"the provider rate budget ({lim.rate_per_second}/s, STRIPE_RATE_LIMIT_PER_SECOND)"
        return f"{budget} is spent{'' if customer else ' for background work'}; next call in {wait:.2f} s"

    def _give_back(self, grant: Grant) -> None:
        if grant.local:
            return  # this process's own view: its share refills soon enough
        self._run(
            "give_back",
            _BUCKET_GIVE_BACK,
            [self.bucket_key, self.endpoint_prefix + grant.endpoint],
            [self.limits.bucket_capacity, grant.member],
        )

    def pause(self, seconds: float) -> None:
        """The provider said 429: nobody calls it again until Retry-After has passed."""
        self.local.pause(time.time() + seconds)
        self._run("pause", _BUCKET_PAUSE, [self.bucket_key], [repr(seconds)])

    # The line ---------------------------------------------------------------------------------

    def line_seen_held(self) -> bool:
        """Did this process meet the line held within the last LINE_SEEN_SECONDS? A customer's
        new session then joins the line at once, without building a request only to have it
        refused (a checkout in a sale would otherwise spend a few ms of CPU on each)."""
        return current().priority == CUSTOMER and not current().in_line and time.monotonic() < self._line_seen_until

    def hold_line(self, seconds: float) -> None:
        """Orders wait in line for a payment session: for the next `seconds`, a customer's new
        session is not created ahead of them (take_token's `behind_line`). The payment queue
        renews it while anyone waits; it lapses by itself (a Redis that lost it only lets a few
        checkouts go first until the next renewal)."""
        from redis.exceptions import RedisError

        try:
            conn = self._connection()
            if conn is not None:
                conn.set(self.line_key, 1, px=max(1, int(seconds * 1000)))
        except RedisError as exc:
            self._unreachable(exc)

    def open_line(self) -> None:
        """Nobody waits in line any more: customers' sessions are created at once again."""
        from redis.exceptions import RedisError

        try:
            conn = self._connection()
            if conn is not None:
                conn.delete(self.line_key)
        except RedisError as exc:
            self._unreachable(exc)


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
        endpoint_rate_per_second=cfg["STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND"],
    )


def get() -> ProviderGuard:
    cfg = current_app.config
    return per_app("provider_guard", lambda: ProviderGuard(limits_from(cfg), cfg.get("REDIS_URL"), cfg["QUEUE_PREFIX"]))
