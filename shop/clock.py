"""The one clock the shop reads: the time of day (aware UTC), a monotonic clock for intervals,
and sleeping. The provider guard (its token buckets, the breaker, the grants' freshness), the
leases (outbox claims, the sweep's and the prune's) and the deadlines all read it.

The process's clock is set by create_app (`CLOCK` in its test_config; otherwise the system's) and
read with `current()`: a module-level accessor rather than something kept on the app, because the
pure domain (deadlines.utcnow) and threads that run outside any app context read it too. Tests
give the app a clock they move by hand (tests/support.py, FakeClock) instead of waiting for the
real one; nothing else ever sets it.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The time of day, an aware UTC datetime."""
        ...

    def time(self) -> float:
        """The time of day in seconds since the epoch (now() as a timestamp)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for intervals and deadlines within the process."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let `seconds` pass on this clock."""

    def shared_time(self) -> float | None:
        """The time shared state kept in Redis is to take as now (the guard's scripts), or None:
        Redis's own clock (TIME), the system's choice, since callers' clocks read late or run
        ahead (provider/guard/shared.py). A clock set by hand gives its own time, so that the
        buckets and the breaker in Redis move with it."""


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def shared_time(self) -> float | None:
        return None


_current: Clock = SystemClock()


def current() -> Clock:
    """The process's clock (the system's unless create_app was given another)."""
    return _current


def use(clock: Clock | None) -> Clock:
    """Make `clock` the process's clock (None: the system's); returns the one it replaces."""
    global _current
    previous, _current = _current, clock if clock is not None else SystemClock()
    return previous
