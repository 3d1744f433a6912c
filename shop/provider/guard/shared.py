"""Redis for the guard's shared state (the breaker, the budgets, the line), used only while it
answers: each caller falls back to this process's own view (`local._LocalState`) when it does not.

Every time in the scripts is Redis's own clock (TIME), never the caller's. A caller's clock read
before it waited for the GIL, its socket or the script lock is late, and another host's clock may
be off: with callers' clocks a late caller rewound the token bucket (the next caller was refilled
for the same interval again), and a process whose clock ran ahead ended another's breaker
cool-down early. Only a clock set by hand (tests: shop.clock) gives the scripts its own time,
so that the buckets and the breaker move with it: `run` passes it as the last argument.
"""

from __future__ import annotations

import logging

from ... import clock
from ...redis_client import redis_client

log = logging.getLogger("shop.payments.guard")

# The clock every script starts with (see above): Redis's TIME, unless the last argument
# (appended by SharedRedis.run) is a time given by a clock set by hand.
_REDIS_NOW = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if #ARGV > 0 and ARGV[#ARGV] ~= '' then now = tonumber(ARGV[#ARGV]) end
"""

# After Redis fails, this process uses its own view for a while instead of paying a connect
# timeout on every provider call.
REDIS_RETRY_SECONDS = 5.0


class SharedRedis:
    """The guard's Redis connection and its scripts, or None while Redis is taken to be unreachable."""

    def __init__(self, redis_url: str | None):
        self.redis_url = redis_url
        self._redis = None
        self._down_until = 0.0
        self._scripts: dict = {}

    def connection(self):
        """The Redis client, or None while Redis is taken to be unreachable."""
        if self.redis_url is None or clock.current().monotonic() < self._down_until:
            return None
        if self._redis is None:
            self._redis = _connect(self.redis_url)
        return self._redis

    def unreachable(self, exc) -> None:
        log.warning(
            "provider guard: Redis unreachable (%s); this process uses its own view for %.0f s",
            exc,
            REDIS_RETRY_SECONDS,
        )
        self._down_until = clock.current().monotonic() + REDIS_RETRY_SECONDS

    def run(self, name: str, source: str, keys, args):
        """Run one of the scripts; None when Redis is unreachable (the caller uses its own view)."""
        from redis.exceptions import RedisError

        try:
            conn = self.connection()
            if conn is None:
                return None
            script = self._scripts.get(name)
            if script is None:
                script = self._scripts[name] = conn.register_script(source)
            given = clock.current().shared_time()
            return script(keys=keys, args=[*args, "" if given is None else repr(given)])
        except RedisError as exc:
            self.unreachable(exc)
            return None

    def command(self, call) -> None:
        """Send one plain command (`call(connection)`); nothing when Redis is unreachable."""
        from redis.exceptions import RedisError

        try:
            conn = self.connection()
            if conn is not None:
                call(conn)
        except RedisError as exc:
            self.unreachable(exc)


def _connect(url: str):
    """Redis for the guard. A short connect timeout (a Redis that is down costs a customer 0.25 s
    once, then this process uses its own view for REDIS_RETRY_SECONDS); a longer read timeout,
    because in a web process busy with dozens of threads the answer can wait that long for the
    GIL, and falling back then would let every process spend the whole budget on its own."""
    return redis_client(url, socket_connect_timeout=0.25, socket_timeout=1.0)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
