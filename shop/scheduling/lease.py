"""The sweep's lease: only one cycle runs anywhere at a time. A row in `leases` taken with a
conditional UPDATE (or an INSERT when absent; see outbox.leases), renewed as it runs down and
checked before each order, against the cycle's own clock."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy import select

from ..domain.deadlines import as_utc, utcnow
from ..extensions import db
from ..models import Lease
from ..outbox.leases import renew_lease

LEASE_NAME = "reconciliation-sweep"
# BACKSTOP_RECONCILIATION_LEASE_SECONDS (config RECONCILIATION_LEASE_SECONDS): long enough for
# a batch of slow provider calls between two renewals, short enough that a crashed or frozen
# holder on another machine blocks the next cycle for minutes, not hours.
DEFAULT_LEASE_SECONDS = 300


class Clock:
    """The cycle's clock: the wall clock, or an injected `now` that advances with real elapsed
    time (so a test can put a cycle anywhere in time and the lease still runs out)."""

    def __init__(self, now: datetime | None):
        self._base = as_utc(now) if now is not None else None
        self._t0 = time.monotonic()

    def __call__(self) -> datetime:
        if self._base is None:
            return utcnow()
        return self._base + timedelta(seconds=time.monotonic() - self._t0)


class LeaseLost(Exception):
    pass


class LeaseKeeper:
    """Called before each order: is the lease still ours? Nobody can take it before it lapses,
    so while most of it is left the answer is local; once a third is used it is renewed in the
    database (conditionally, so a lapsed or taken-over lease stays lost)."""

    def __init__(self, holder: str, expires_at: datetime, seconds: float, clock):
        self.holder, self.expires_at, self.seconds, self.clock = holder, expires_at, seconds, clock

    def __call__(self) -> bool:
        now = self.clock()
        if now >= self.expires_at:
            return False
        if (self.expires_at - now).total_seconds() > self.seconds * 2 / 3:
            return True
        if not renew_lease(LEASE_NAME, self.holder, now, self.seconds):
            return False
        self.expires_at = now + timedelta(seconds=self.seconds)
        return True


def lease_held_by_another() -> str:
    session = db.session
    current = session.execute(select(Lease.holder, Lease.expires_at).where(Lease.name == LEASE_NAME)).first()
    session.rollback()
    reason = "another cycle holds the sweep lease"
    if current is not None:
        reason += f" ({current.holder}, until {as_utc(current.expires_at).isoformat(timespec='seconds')})"
    return reason
