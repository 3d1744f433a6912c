"""Deadlines at the provider falling due together learn their sessions' ends from one read.

An order waiting at the hosted payment page is cancelled by its deadline once the provider has
expired its session; when the `checkout.session.expired` webhook is lost, the deadline asks the
provider. One retrieve per order is one call per order on an endpoint limited to 20 a second: 200
sessions ending at one instant (a sale's checkouts, a provider outage's backlog) would finish their
deadlines ten seconds late and spend the whole budget the customers' return pages share.

So while at least BULK_THRESHOLD such deadlines are due within BURST_SECONDS, one of them (across
every process: a claim in Redis) reads the provider's event list from just before the earliest of
their sessions' ends and keeps every expiry it lists in Redis for a few minutes; each deadline of
the group then takes its session's expiry from there, and only a session the read left open (not
expired at the provider yet, paid, or beyond the pages read) is asked about alone, as before.

A group does not wait a fixed grace for the provider's own expiry: its deadlines first look
FIRST_LOOK after their sessions' end, and while the provider has not listed a session expired
they read again every REREAD (one reader at a time), so each order is cancelled about as soon as
the provider expires its session. A session a read lists in any other way (paid, still paying)
is asked about alone at once; one never listed is asked alone after GROUP_PATIENCE. A lone
deadline waits EXPIRY_GRACE, then asks.

An expiry is final at the provider (an expired session never takes money), so a kept one cannot
go stale. Redis is only a cache here: without it every deadline asks alone, as it did."""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime, timedelta

from flask import current_app
from redis.exceptions import RedisError
from sqlalchemy import func, select

from ..domain.deadlines import as_utc
from ..domain.order import OrderStatus
from ..extensions import db
from ..models import CommandKind, Order, ScheduledCommand, WorkStatus
from ..outbox.failures import Reschedule
from ..provider import gateway
from ..queue.connection import redis_conn

log = logging.getLogger("shop.payments")

# A group this large reads the event list; below it each deadline asks alone (a retrieve is one
# call too, and a read may need a page per ORDERS_PER_PAGE orders).
BULK_THRESHOLD = 20
ORDERS_PER_PAGE = 20
# Deadlines due within this many seconds of one another count as one group.
BURST_SECONDS = 5
# The read starts this long before the earliest session's end (the provider's clock and ours).
SLACK = timedelta(minutes=1)
# How long a kept expiry, and the instant of the last read, stay in Redis.
KEEP_SECONDS = 600
# A reader holds its claim at most this long (a reader whose process died is replaced after it).
CLAIM_MS = 5_000
# A deadline at the provider first looks this long after its session's end (a group reads then).
FIRST_LOOK = timedelta(seconds=0.5)
# The provider expires a session within this long of its end: a lone deadline asks after it.
EXPIRY_GRACE = timedelta(seconds=2)
# A group reads the event list again this often while sessions it waits for are not listed ...
REREAD = timedelta(seconds=0.5)
# ... for this long after their end; then each asks alone (the provider is slow to expire them).
GROUP_PATIENCE = timedelta(seconds=10)
# What a read keeps for a session it listed in another way than expired: ask about it alone now.
_ASK_ALONE = b"ask"
# A deadline that finds another process reading waits this long for its answer.
WAIT_FOR_READER = timedelta(seconds=0.2)


def _key(name: str) -> str:
    return f"{current_app.config['QUEUE_PREFIX']}:provider-expiries:{name}"


def known_expiry(session_id: str, session_ends: datetime, now: datetime) -> gateway.SessionEvent | None:
    """The provider's expiry event of `session_id` when a read of the event list (this one's or
    another deadline's) listed it; None when this deadline should ask the provider alone now (a
    small group past EXPIRY_GRACE, Redis away, a session listed paid or paying, or one the reads
    did not list within GROUP_PATIENCE). Raises Reschedule for the instant to look again: before
    a lone deadline's grace, while another process reads, or until the group's next read. Raises
    the provider's errors of a read."""
    try:
        conn = redis_conn()
        kept = conn.get(_key(session_id))
        if kept is not None:
            return _kept_answer(kept)
        group = _due_group(now)
        if group is None:
            return _alone_after_grace(session_ends, now)
        if now >= session_ends + GROUP_PATIENCE:
            return None
        read_at = _last_read(conn)
        if read_at is not None and read_at >= session_ends and now < read_at + REREAD:
            raise Reschedule(read_at + REREAD)  # a read made since the end found it open: wait for the next
        token = secrets.token_hex(8)
        if not conn.set(_key("reader"), token, nx=True, px=CLAIM_MS):
            raise Reschedule(now + WAIT_FOR_READER)
        try:
            # The reader before may have finished between the look above and this claim.
            kept = conn.get(_key(session_id))
            if kept is None:
                _read(conn, *group, now)
                kept = conn.get(_key(session_id))
        finally:
            if conn.get(_key("reader")) == token.encode():
                conn.delete(_key("reader"))
    except RedisError as exc:
        log.info("deadline: Redis did not answer (%s); asking the provider about session %s alone", exc, session_id)
        return _alone_after_grace(session_ends, now)
    if kept is None:
        raise Reschedule(now + REREAD)  # not expired at the provider yet: the group's next read
    return _kept_answer(kept)


def _kept_answer(kept: bytes | str) -> gateway.SessionEvent | None:
    """A kept expiry; None for a session listed paid or paying: its own answer is asked for now."""
    return None if kept in (_ASK_ALONE, _ASK_ALONE.decode()) else gateway.SessionEvent.from_kept(kept)


def _alone_after_grace(session_ends: datetime, now: datetime) -> None:
    """None (ask the provider alone) once the provider's grace to expire the session has passed."""
    if now < session_ends + EXPIRY_GRACE:
        raise Reschedule(session_ends + EXPIRY_GRACE)
    return None


def _last_read(conn) -> datetime | None:
    read_at = conn.get(_key("read-at"))
    return None if read_at is None else datetime.fromtimestamp(float(read_at), tz=UTC)


def _due_group(now: datetime) -> tuple[int, datetime] | None:
    """(how many, the earliest session end) of the deadlines of orders at the payment page due
    within BURST_SECONDS, when they are at least BULK_THRESHOLD; else None. The running one is
    claimed (processing), so it counts too."""
    query = (
        select(func.count(), func.min(Order.payment_session_expires_at))
        .select_from(ScheduledCommand)
        .join(Order, Order.id == ScheduledCommand.order_id)
        .where(
            ScheduledCommand.kind == CommandKind.EXPIRE_UNPAID_ORDER,
            ScheduledCommand.status.in_([WorkStatus.PENDING, WorkStatus.PROCESSING]),
            ScheduledCommand.next_attempt_at <= now + timedelta(seconds=BURST_SECONDS),
            Order.status == OrderStatus.PAYMENT_INITIATED,
        )
    )
    count, earliest = db.session.execute(query).one()
    if count < BULK_THRESHOLD or earliest is None:
        return None
    return count, as_utc(earliest)


def _read(conn, count: int, earliest_end: datetime, now: datetime) -> None:
    """Read the provider's session events since just before `earliest_end`, newest first, at most
    a page per ORDERS_PER_PAGE deadlines of the group, and keep every expiry listed."""
    since, after, pages, expiries = earliest_end - SLACK, None, 0, 0
    while pages < max(1, count // ORDERS_PER_PAGE):
        events, more = gateway.session_events(since=since, starting_after=after)
        pages += 1
        with conn.pipeline(transaction=False) as pipe:
            for event in events:
                if event.view.status == gateway.SessionStatus.EXPIRED:
                    pipe.set(_key(event.view.id), event.kept(), ex=KEEP_SECONDS)
                    expiries += 1
                else:  # paid or paying (an expiry, final, overwrites this): its deadline asks alone
                    pipe.set(_key(event.view.id), _ASK_ALONE, ex=KEEP_SECONDS, nx=True)
            pipe.execute()
        if not more or not events:
            break
        after = events[-1].id
    conn.set(_key("read-at"), str(now.timestamp()), ex=KEEP_SECONDS)
    log.info(
        "deadlines: %d due together at the provider; %d page(s) of its events listed %d expired session(s)",
        count,
        pages,
        expiries,
    )
