"""The sweep's lease: only one cycle runs anywhere at a time. A row in `leases` taken with a
conditional UPDATE (or an INSERT when absent; see outbox.leases), kept SHORT and renewed by a
heartbeat thread while the cycle works, and checked before each order against the cycle's own
clock.

Why short and renewed: a holder that dies on another machine (or freezes) is noticed only when
its lease lapses, since nobody can look at its process from here. A long lease that the cycle
renews between orders would block every other cycle for as long as it lasts; a short one that a
thread renews every quarter of it lapses within one lease length of the holder's death, and the
scheduler's poll (`abandoned_holder`) then starts a cycle that takes it over.

The heartbeat renews on a connection of its own in one short transaction per beat, conditionally
on still holding the lease (holder and not lapsed), so a lease once lost stays lost: the cycle's
check before each order stops it as soon as the heartbeat was refused, or as soon as the last
renewal the heartbeat could confirm runs out (a frozen process, a database it cannot reach)."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from sqlalchemy import select

from .. import clock, failpoints
from ..domain.deadlines import as_utc, utcnow
from ..extensions import db
from ..models import Lease
from ..outbox.leases import holder_is_gone, renew_lease_on

log = logging.getLogger("shop.sweep")

LEASE_NAME = "reconciliation-sweep"
# BACKSTOP_RECONCILIATION_LEASE_SECONDS (config RECONCILIATION_LEASE_SECONDS): how long the lease
# holds without a renewal. The heartbeat renews it every quarter of it, so it only needs to
# outlast a few missed beats (a database blip, a busy SQLite writer); short, because a holder
# that died elsewhere keeps every other cycle out until it lapses (the shop promises the sweep is
# taken over within 30 s: this, plus the scheduler's poll, plus a worker picking the job up).
DEFAULT_LEASE_SECONDS = 20
BEATS_PER_LEASE = 4


class Clock:
    """The cycle's clock: the wall clock, or an injected `now` that advances with real elapsed
    time (so a test can put a cycle anywhere in time and the lease still runs out)."""

    def __init__(self, now: datetime | None):
        self._base = as_utc(now) if now is not None else None
        self._t0 = clock.current().monotonic()

    def __call__(self) -> datetime:
        if self._base is None:
            return utcnow()
        return self._base + timedelta(seconds=clock.current().monotonic() - self._t0)


class LeaseLost(Exception):
    pass


class LeaseHeartbeat:
    """Renews the lease from a thread of its own while the cycle works, every `seconds / 4`.

    `expires_at` is the end of the lease as last confirmed by the database (the renewal's `now`
    is read before its UPDATE is sent, so the local view is never later than the row's). A
    renewal the database refuses (the lease lapsed or was taken over) sets `lost` and ends the
    thread; one that fails (the database unreachable, a lock wait that timed out) is retried
    within a second, and the lease simply runs out if none gets through."""

    def __init__(self, engine, name: str, holder: str, expires_at: datetime, seconds: float, clock):
        self.engine, self.name, self.holder, self.seconds, self.clock = engine, name, holder, seconds, clock
        self.expires_at = expires_at
        self.lost = False
        self.every = seconds / BEATS_PER_LEASE
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LeaseHeartbeat:
        self._thread = threading.Thread(target=self._run, name=f"lease-heartbeat-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """No renewal starts after this. One already under way may still land: before the cycle
        releases the lease it is deleted with it, after, it matches no row. Not waited for here:
        on SQLite it may be waiting for the write lock that the cycle's session holds (`join`)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end, once the cycle's own transactions have: a renewal still
        under way holds a connection of the pool until it lands, and the cycle returns only once
        it has (or after `timeout`, for a renewal that hangs)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def holds(self) -> bool:
        """Is the lease still ours, as far as the database last confirmed it?"""
        return not self.lost and self.clock() < self.expires_at

    def beat(self) -> bool:
        """One renewal. True when the database extended the lease."""
        now = self.clock()
        if renew_lease_on(self.engine, self.name, self.holder, now, self.seconds):
            self.expires_at = now + timedelta(seconds=self.seconds)
            return True
        self.lost = True
        return False

    def _run(self) -> None:
        wait = self.every
        while not self._stop.wait(wait):
            try:
                failpoints.hit("sweep.lease_heartbeat")
                if self._stop.is_set():
                    return
                if not self.beat():
                    if self._stop.is_set():
                        return  # the cycle ended and released the lease meanwhile
                    log.warning("sweep: the lease's heartbeat was refused (lapsed or taken over); the cycle stops")
                    return
                wait = self.every
            except Exception as exc:  # noqa: BLE001 - retried; the lease runs out if none gets through
                log.warning("sweep: could not renew the lease (%s); retrying", str(exc).splitlines()[0][:200])
                wait = min(self.every, 1.0)


class LeaseKeeper:
    """Called before each order: is the lease still ours? The heartbeat keeps it; this only reads
    what the heartbeat last confirmed (its refusal, or the end of its last renewal), so a cycle
    whose lease was taken over, or that could not renew it in time, stops before the next order."""

    def __init__(self, heartbeat: LeaseHeartbeat):
        self.heartbeat = heartbeat

    def __call__(self) -> bool:
        return self.heartbeat.holds()


def lease_held_by_another() -> str:
    session = db.session
    current = session.execute(select(Lease.holder, Lease.expires_at).where(Lease.name == LEASE_NAME)).first()
    session.rollback()
    reason = "another cycle holds the sweep lease"
    if current is not None:
        reason += f" ({current.holder}, until {as_utc(current.expires_at).isoformat(timespec='seconds')})"
    return reason


def abandoned_holder(now: datetime | None = None) -> str | None:
    """The holder of a sweep lease that was left behind mid-cycle, or None. A cycle that ends
    deletes its lease, so a row that lapsed (its heartbeat stopped: the process died or froze,
    here or on another machine) or whose holder is a process of this machine that no longer
    exists names a cycle that did not finish. One primary-key read."""
    session = db.session
    current = session.execute(select(Lease.holder, Lease.expires_at).where(Lease.name == LEASE_NAME)).first()
    session.rollback()
    if current is None:
        return None
    if as_utc(current.expires_at) < (now or utcnow()) or holder_is_gone(current.holder):
        return current.holder
    return None
