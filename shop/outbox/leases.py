"""Leases: a named, expiring lock in the database (`leases`), so that one process anywhere does
a piece of work at a time (one sweep cycle, one payment queue). Taken with a conditional UPDATE
or, when absent, an INSERT whose primary key settles a tie; renewed only by its holder and only
before it lapses; a holder that died on this machine is taken over at once (its pid is gone),
one elsewhere or a frozen one when its lease lapses. Each verb commits its own transaction."""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ..extensions import db
from ..models import Lease
from ..node import is_this_machine, node_name
from .tables import rows_matched

log = logging.getLogger("shop.leases")


@dataclass(frozen=True)
class Acquired:
    """acquire_lease's answer: true when the lease is ours; `taken_from` names the holder whose
    lease was taken over because its process is gone (for the caller's record)."""

    ok: bool
    taken_from: str | None = None

    def __bool__(self) -> bool:
        return self.ok


def acquire_lease(name: str, holder: str, now: datetime, seconds: float) -> Acquired:
    """Take the named lease if nobody holds a live one. Commits its own transaction.

    Taking over a lapsed lease is a conditional UPDATE (on PostgreSQL a concurrent second UPDATE
    re-reads the row after the first commits and no longer matches); creating it is an INSERT
    whose primary key lets exactly one of two concurrent creators win."""
    session = db.session
    expires = now + timedelta(seconds=seconds)
    try:
        taken = session.execute(
            update(Lease)
            .where(Lease.name == name, Lease.expires_at < now)
            .values(holder=holder, expires_at=expires)
            .execution_options(synchronize_session=False)
        )
        if rows_matched(taken) == 1:
            session.commit()
            return Acquired(True)
        current = session.execute(select(Lease.holder).where(Lease.name == name)).first()
        if current is not None:
            if current.holder != holder and holder_is_gone(current.holder):
                # Its holder died on this machine (a worker SIGKILLed mid-cycle): take the lease
                # now instead of leaving the work undone until it lapses, minutes later.
                taken = session.execute(
                    update(Lease)
                    .where(Lease.name == name, Lease.holder == current.holder)
                    .values(holder=holder, expires_at=expires)
                    .execution_options(synchronize_session=False)
                )
                if rows_matched(taken) == 1:
                    session.commit()
                    log.warning("%s: took over the lease of %s, a process that no longer exists", name, current.holder)
                    return Acquired(True, taken_from=current.holder)
            session.rollback()
            return Acquired(False)  # someone holds it and it has not lapsed
        session.execute(insert(Lease).values(name=name, holder=holder, expires_at=expires))
        session.commit()
        return Acquired(True)
    except IntegrityError:
        session.rollback()
        return Acquired(False)
    except BaseException:
        session.rollback()
        raise


def _renewal(name: str, holder: str, now: datetime, seconds: float):
    return (
        update(Lease)
        .where(Lease.name == name, Lease.holder == holder, Lease.expires_at >= now)
        .values(expires_at=now + timedelta(seconds=seconds))
        .execution_options(synchronize_session=False)
    )


def renew_lease(name: str, holder: str, now: datetime, seconds: float) -> bool:
    """Extend our lease, only if it is still ours and has not lapsed. Commits."""
    session = db.session
    try:
        renewed = session.execute(_renewal(name, holder, now, seconds))
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return rows_matched(renewed) == 1


def renew_lease_on(engine, name: str, holder: str, now: datetime, seconds: float) -> bool:
    """renew_lease on a connection of its own (a heartbeat thread's, beside a session that may be
    in the middle of a transaction): one statement in one short transaction, nothing left on the
    connection afterwards, so it suits PgBouncer's transaction pooling; on SQLite the BEGIN
    IMMEDIATE waits for the write lock like any other writer."""
    with engine.begin() as conn:
        return conn.execute(_renewal(name, holder, now, seconds)).rowcount == 1


def release_lease(name: str, holder: str) -> None:
    session = db.session
    try:
        session.execute(
            delete(Lease).where(Lease.name == name, Lease.holder == holder).execution_options(synchronize_session=False)
        )
        session.commit()
    except Exception as exc:  # it lapses by itself; the next taker only waits for it
        session.rollback()
        log.warning("could not release the %s lease (%s); it lapses by itself", name, exc)


def holder_name() -> str:
    """This process, as a lease's holder: `node:pid:nonce` (a fresh nonce for each taking)."""
    return f"{node_name()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_gone(holder: str) -> bool:
    """True only when the holder (node:pid:nonce) was a process on this machine that no longer
    exists. A holder on another node, or one that cannot be checked, is taken to be alive: its
    lease lapses by itself. Its pid is checked here only when its node is ours and our node is
    this machine's host name (shop.node.is_this_machine): two machines or containers sharing a
    node name by mistake never take each other's live leases."""
    node, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if not is_this_machine(node) or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid() or pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, as another user's process
        return False
    return False
