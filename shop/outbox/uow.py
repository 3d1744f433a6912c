"""One use case = one transaction. `transaction()` commits the session, writes the events the
aggregates recorded to the outbox in that same commit, and only then tells Redis. Every use case
commits through it; `commit` and `rollback` are its parts."""

from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import event
from sqlalchemy.orm import Session

from .. import queue
from ..domain.order import OrderRules
from ..extensions import db
from .announce import announce_or_leave_to_relay
from .writer import write_events


@event.listens_for(Session, "before_flush")
def _hold_recording_aggregates(session, _flush_context, _instances) -> None:
    # Once flushed, an aggregate is clean and the session holds it only weakly: a handler that
    # flushes (to meet a version conflict inside its own code) and returns would let the garbage
    # collector take the order together with the events it recorded. Hold it until the end of
    # the transaction.
    held = session.info.setdefault("recording", [])
    for obj in list(session.dirty) + list(session.new):
        if isinstance(obj, OrderRules) and obj.pending_events and not any(h is obj for h in held):
            held.append(obj)


@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_rollback")
def _release_recording_aggregates(session, *_args) -> None:
    session.info.pop("recording", None)


def _aggregates(session) -> list:
    seen, found = set(), []
    for obj in list(session.info.get("recording", ())) + list(session.identity_map.values()) + list(session.new):
        if isinstance(obj, OrderRules) and id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)
    return found


def _recorded_events(session) -> list:
    events = []
    for obj in _aggregates(session):
        if obj.pending_events:
            events.extend(obj.pending_events)
            obj.pending_events.clear()
    return events


def _forget(session) -> None:
    session.info.pop("after_commit", None)
    for obj in _aggregates(session):
        obj.pending_events.clear()
    session.info.pop("recording", None)


def commit(session) -> None:
    """Write what the aggregates recorded to the outbox, then commit, all in one transaction."""
    session.flush()  # new aggregates get their ids before their events are written
    write_events(session, _recorded_events(session))
    session.commit()


def rollback(session) -> None:
    """Roll back and forget what the aggregates recorded, so no event of an undone change
    can reach a later commit."""
    _forget(session)  # first: the rollback itself lets go of the aggregates held for this transaction
    session.rollback()


@contextmanager
def transaction():
    """The one commit path of every use case: `with uow.transaction() as session:` ... on leaving
    the block the recorded events go to the outbox and everything commits together; only then is
    Redis told. Anything raised rolls it all back (events included), announces nothing, and is
    re-raised: a caller that retries (a lost version check) catches it outside the block and
    enters a fresh one. An announce that fails is only logged: the rows are committed and the
    relay announces them after its grace period."""
    session = db.session
    try:
        yield session
        commit(session)
    except BaseException:
        rollback(session)
        raise
    publish_after_commit(session)


def publish_after_commit(session) -> None:
    pending = session.info.pop("after_commit", None)
    if not pending or not (pending["deliveries"] or pending["commands"] or pending.get("retired")):
        return
    announce_or_leave_to_relay(
        lambda: queue.announce(pending["deliveries"], pending["commands"], retired=pending.get("retired", ())),
        "%d deliveries / %d commands committed",
        len(pending["deliveries"]),
        len(pending["commands"]),
    )
