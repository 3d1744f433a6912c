"""The rate budget, shared in Redis (this process's share of it while Redis is away): a token
bucket of STRIPE_RATE_LIMIT_PER_SECOND for the whole account, and a sliding window for each
endpoint (method + path template) of STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND, both taken at once.
Customer calls may take the last of either; background calls only while a reserve is left, so the
sweep and refunds take what checkout leaves. A 429 pauses everyone until its Retry-After. While
orders wait in line for a payment session, a customer's new session is not created ahead of them
(`line.Line`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from ... import clock
from .calls import Priority, current
from .limits import GRANT_FRESH_SECONDS, Limits
from .refusals import Shed, ShedKind
from .shared import _REDIS_NOW, SharedRedis, _text


class Held(StrEnum):
    """Which budget held a call back (the scripts' and this process's own answer): none, the
    account's bucket, the endpoint's window, a 429's pause, or the line."""

    NONE = ""
    ACCOUNT = "account"
    ENDPOINT = "endpoint"
    PAUSED = "paused"
    LINE = "line"


# The rate budget, taken in one step: the account's token bucket (KEYS[1]) refills at `rate`
# per second up to `capacity`, and a call takes a token if that leaves at least `floor` (0 for
# customers, the reserve for background callers); the endpoint's window (KEYS[2], a sorted set of
# grant times, its own limit of `ep_limit` in any `ep_window` seconds less `ep_reserve` for
# background callers) must have room too. Both or neither are taken. Otherwise the reply says
# how many milliseconds until the call could go, and which budget held it. `paused_until` (a
# 429's Retry-After) stops everyone until then; KEYS[3] holding a time still ahead (orders waiting
# in line for a session, `line.Line`) refuses the calls that must not pass them (`respect_line`).
# A hold written by the release before (the marker 1, lapsing by the key's own 3 s expiry; no
# clock reads a time below 10^9 s, in 2001) holds too: a rolling deploy does not open the line.
# With callers' clocks, dozens of busy threads polling let more calls through than the budget (see
# shared.py).
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
local line = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if respect_line == 1 and (line > now or (line > 0 and line < 1000000000)) then return {0, 0, 'line', ''} end
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


@dataclass(frozen=True)
class Grant:
    """A unit of the rate budget taken for one request (see Budget.take_token), to be confirmed
    right before the request is written (Budget.confirm)."""

    endpoint: str
    member: str = ""  # its place in the endpoint's window ("" without one, or locally)
    local: bool = False  # taken from this process's own view (Redis unreachable)
    behind_line: bool = False  # as asked: a payment session a customer must not create ahead of the line
    # the clock's monotonic() when it was asked for: the budget granted it no earlier, so the time since
    # then is at least the grant's age, whatever Redis's clock says.
    asked: float = 0.0

    def fresh(self) -> bool:
        return clock.current().monotonic() - self.asked <= GRANT_FRESH_SECONDS


class Budget:
    """The account's bucket and the endpoints' windows (`bucket_key`, `endpoint_prefix` + the
    endpoint), and the line's hold on new sessions (`line`)."""

    def __init__(self, limits: Limits, shared: SharedRedis, local, line, bucket_key: str, endpoint_prefix: str):
        self.limits = limits
        self.shared = shared
        self.local = local
        self.line = line
        self.bucket_key = bucket_key
        self.endpoint_prefix = endpoint_prefix

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

    def confirm(self, grant: Grant) -> Grant:
        """Right before the request's first byte is written (the connection made): the grant
        itself while it is fresh; else it is given back and another taken, as take_token takes it
        (waiting, or Shed). A thread can be held up for a long time between taking a grant and
        writing its request (the GIL, the scheduler, checking or opening the pooled connection),
        and a request written late reaches the provider together with the ones granted after it:
        only a grant at most GRANT_FRESH_SECONDS old when its bytes go out stays within the
        endpoint window's slack (limits.ENDPOINT_WINDOW_SLACK_SECONDS)."""
        while not grant.fresh():
            self._give_back(grant)
            grant = self._take_token(grant.endpoint, grant.behind_line)
        return grant

    def _take_token(self, endpoint: str, behind_line: bool) -> Grant:
        lim = self.limits
        ctx = current()
        customer = ctx.priority is Priority.CUSTOMER
        floor = 0 if customer else lim.background_reserve
        if ctx.patience is not None:
            patience = ctx.patience
        else:
            patience = lim.customer_wait_seconds if customer else lim.background_wait_seconds
        give_up = clock.current().monotonic() + patience
        if ctx.deadline is not None:
            give_up = min(give_up, ctx.deadline)
        respect_line = 1 if behind_line and customer and not ctx.in_line else 0
        limit = lim.endpoint_rate_per_second if endpoint else 0
        keys = [self.bucket_key, self.endpoint_prefix + endpoint, self.line.key]
        stale = False  # a grant came back too late to be used (this process was held up)
        while True:
            asked = clock.current().monotonic()
            reply = self.shared.run(
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
                granted, wait, held = int(reply[0]) == 1, int(reply[1]) / 1000, Held(_text(reply[2]))
                grant = Grant(endpoint, _text(reply[3]), behind_line=behind_line, asked=asked)
            else:
                wait, held = self.local.take(clock.current().time(), lim, floor, endpoint, customer)
                granted, grant = held is Held.NONE, Grant(endpoint, local=True, behind_line=behind_line, asked=asked)
            if held is Held.LINE:
                self.line.saw_held()
                raise Shed(
                    "customers are waiting in line for a payment session; this one joins them", kind=ShedKind.LINE
                )
            if granted:
                if grant.fresh():
                    return grant
                # Granted somewhere in [asked, now], too long ago to be sent with the calls
                # granted after it (see GRANT_FRESH_SECONDS): given back, and asked again at once.
                # The budget had room: the time went to this process being held up (a pause, a
                # starved core), not to waiting for the budget. So the first grant that comes back
                # stale is asked for again even when that one stall outlasted the caller's
                # patience (never past its deadline); a process held up again is refused.
                self._give_back(grant)
                wait, first_stale, stale = 0.0, not stale, True
                if first_stale and (ctx.deadline is None or clock.current().monotonic() < ctx.deadline):
                    continue
            if clock.current().monotonic() + wait > give_up:
                why = _held_up(customer) if stale and granted else self._spent(held, endpoint, wait, customer)
                raise Shed(why, retry_after=max(wait, 0.1), kind=ShedKind.BUDGET)
            if wait > 0:
                # Spread the wake-ups: every waiting thread was told the same time. A call that
                # holds its turn (the payment queue's) is the only one waiting: it wakes on time.
                spread = 1.0 if ctx.turn is not None else random.uniform(1.0, 1.5)
                clock.current().sleep(max(wait, 0.002) * spread)

    def _spent(self, held: Held, endpoint: str, wait: float, customer: bool) -> str:
        lim = self.limits
        if held is Held.ENDPOINT:
            budget = (
                f"the provider budget for {endpoint} ({lim.endpoint_rate_per_second}/s, "
                "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND)"
            )
        elif held is Held.PAUSED:
            budget = "the provider rate budget (paused by the provider's 429 until its Retry-After)"
        else:
            budget = f"the provider rate budget ({lim.rate_per_second}/s, STRIPE_RATE_LIMIT_PER_SECOND)"
        return f"{budget} is spent{'' if customer else ' for background work'}; next call in {wait:.2f} s"

    def _give_back(self, grant: Grant) -> None:
        if grant.local:
            return  # this process's own view: its share refills soon enough
        self.shared.run(
            "give_back",
            _BUCKET_GIVE_BACK,
            [self.bucket_key, self.endpoint_prefix + grant.endpoint],
            [self.limits.bucket_capacity, grant.member],
        )

    def pause(self, seconds: float) -> None:
        """The provider said 429: nobody calls it again until Retry-After has passed."""
        self.local.pause(clock.current().time() + seconds)
        self.shared.run("pause", _BUCKET_PAUSE, [self.bucket_key], [repr(seconds)])


def _held_up(customer: bool) -> str:
    """Why a call is refused whose grants all came back too late to be used (see _take_token)."""
    budget = "the provider rate budget" + ("" if customer else " for background work")
    return (
        f"this process was held up past each grant of {budget}: they came back more than "
        f"{GRANT_FRESH_SECONDS} s old, too late to be sent"
    )
