"""The circuit breaker, shared in Redis (this process's own view while Redis is away): after
BREAKER_THRESHOLD failures in a row it opens and no customer's or worker's call is made. While it
is open, one probe for the whole shop (claimed here, made by `probe.Prober`) learns that the
provider answers again, and its first success closes the breaker for every process. Probes that
keep failing back off, up to the cool-down. A customer's call is never the probe."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from ... import clock
from .limits import Limits
from .refusals import Shed, ShedKind
from .shared import _REDIS_NOW, SharedRedis, _text

log = logging.getLogger("shop.payments.guard")


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


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

# Probes while the breaker is open: at most one per PROBE_SPACING_SECONDS across every process (a
# little over a second, so that their arrivals at the provider stay a second apart whatever the
# way there takes), at that pace for the first PROBE_STEADY failures (about ten seconds: a blip
# is over within about a second of the provider's return), then doubling up to the cool-down.
# A prober thread asks for the claim this often while it waits.
PROBE_SPACING_SECONDS = 1.1
PROBE_STEADY = 10
PROBE_POLL_SECONDS = 0.2


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


class Breaker:
    """The breaker's hash in Redis (`key`), and this process's own view when Redis is away."""

    def __init__(self, limits: Limits, shared: SharedRedis, local, key: str):
        self.limits = limits
        self.shared = shared
        self.local = local
        self.key = key
        self._last_state = BreakerState.CLOSED

    def admit(self) -> None:
        """May a call go now? Raises Shed unless the breaker is closed (then the prober, not a
        customer's call, finds out when the provider answers again)."""
        reply = self.shared.run("admit", _BREAKER_ADMIT, [self.key], [])
        verdict, state = (int(reply[0]), BreakerState(_text(reply[1]))) if reply is not None else self.local.admit()
        self._note(state)
        if verdict == 0:
            raise Shed(
                "the payment provider is failing; no calls are made until a probe finds it answering "
                f"again (circuit breaker {state.replace('_', '-')})",
                retry_after=PROBE_SPACING_SECONDS,
                kind=ShedKind.BREAKER,
            )

    def record(self, ok: bool) -> BreakerState:
        lim = self.limits
        args = [1 if ok else 0, lim.breaker_threshold, PROBE_SPACING_SECONDS]
        return self._told("record", _BREAKER_RECORD, args, lambda now: self.local.record(now, ok, lim))

    def claim_probe(self) -> ProbeTurn:
        lim = self.limits
        reply = self.shared.run("claim_probe", _PROBE_CLAIM, [self.key], [lim.probe_seconds, PROBE_SPACING_SECONDS])
        if reply is None:
            return self.local.claim_probe(clock.current().time(), lim)
        state = BreakerState(_text(reply[1]))
        self._note(state)
        return ProbeTurn(closed=state is BreakerState.CLOSED, mine=int(reply[0]) == 1, wait=int(reply[2]) / 1000)

    def probe_result(self, ok: bool) -> BreakerState:
        lim = self.limits
        args = [1 if ok else 0, PROBE_SPACING_SECONDS, PROBE_STEADY, lim.breaker_cooldown_seconds]
        return self._told("probe_result", _PROBE_RESULT, args, lambda now: self.local.probe_result(now, ok, lim))

    def _told(self, name: str, script: str, args: list, local: Callable[[float], BreakerState]) -> BreakerState:
        """The state a call's outcome leaves the breaker in: Redis's `script` run with `args`, or
        while Redis is away this process's own view told (`local(now)`)."""
        reply = self.shared.run(name, script, [self.key], args)
        state = BreakerState(_text(reply)) if reply is not None else local(clock.current().time())
        self._note(state)
        return state

    def _note(self, state: BreakerState) -> None:
        if state != self._last_state:
            log.warning("provider circuit breaker: %s -> %s", self._last_state, state)
            self._last_state = state

    def note_check(self, ok: bool, words: str, now: float | None = None) -> None:
        """Keep the outcome of the provider watch's latest check (provider.watch) beside the
        breaker, for the console: when it ran, whether the provider answered, in words, and since
        when the answer has been the same (the card's condition). This process's copy too, for
        while Redis is away."""
        from redis.exceptions import RedisError

        now = clock.current().time() if now is None else now
        previous = self._check
        since = previous["check_since"] if previous and previous["check_ok"] == ok else now
        self._check = {"checked_at": now, "check_ok": ok, "check_words": words, "check_since": since}
        try:
            conn = self.shared.connection()
            if conn is None:
                return
            was = conn.hmget(self.key, "check_ok", "check_since")
            if was[0] is not None and int(_text(was[0])) == int(ok) and was[1] is not None:
                since = float(_text(was[1]))
            self._check["check_since"] = since
            conn.hset(
                self.key,
                mapping={"checked_at": now, "check_ok": int(ok), "check_words": words[:500], "check_since": since},
            )
        except RedisError as exc:
            self.shared.unreachable(exc)

    _check: dict | None = None

    def view(self) -> dict:
        """The breaker as every process sees it (Redis), or this process's own view; with the
        provider watch's latest check (`checked_at` None when none has run)."""
        from redis.exceptions import RedisError

        try:
            conn = self.shared.connection()
            if conn is not None:
                raw = {_text(k): _text(v) for k, v in conn.hgetall(self.key).items()}
                last_probe = float(raw.get("last_probe_at") or 0)
                return {
                    "state": BreakerState(raw.get("state", BreakerState.CLOSED)),
                    "failures": int(raw.get("failures", 0)),
                    "opened_at": float(raw.get("opened_at", 0)),
                    "shared": True,
                    "last_probe_at": last_probe or None,
                    "probe_failures": int(raw.get("probe_failures", 0)),
                    "transitions": {s: int(raw.get(f"to_{s}", 0)) for s in BreakerState},
                    "checked_at": float(raw["checked_at"]) if raw.get("checked_at") else None,
                    "check_ok": raw.get("check_ok") == "1" if raw.get("check_ok") is not None else None,
                    "check_words": raw.get("check_words") or "",
                    "check_since": float(raw["check_since"]) if raw.get("check_since") else None,
                }
        except RedisError:
            pass
        check = self._check or {"checked_at": None, "check_ok": None, "check_words": "", "check_since": None}
        return {**self.local.view(), "shared": False, **check}
