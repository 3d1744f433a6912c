"""One use case = one transaction. `transaction()` commits the session, writes the events the
aggregates recorded to the outbox in that same commit, and only then tells Redis."""
from __future__ import annotations

import logging
from contextlib import contextmanager

from ..extensions import db
from ..domain.order import OrderRules
from .writer import after_commit, write_events

log = logging.getLogger("shop.outbox")


def _recorded_events(session) -> list:
    events = []
    for obj in list(session.identity_map.values()) + list(session.new):
        if isinstance(obj, OrderRules) and obj.pending_events:
            events.extend(obj.pending_events)
            obj.pending_events.clear()
    return events


def _forget(session) -> None:
    session.info.pop("after_commit", None)
    for obj in list(session.identity_map.values()):
        if isinstance(obj, OrderRules):
            obj.pending_events.clear()


def commit(session) -> None:
    """Write what the aggregates recorded to the outbox, then commit, all in one transaction."""
    session.flush()  # new aggregates get their ids before their events are written
    write_events(session, _recorded_events(session))
    session.commit()


def rollback(session) -> None:
    """Roll back and forget what the aggregates recorded, so no event of an undone change
    can reach a later commit."""
    session.rollback()
    _forget(session)


@contextmanager
def transaction():
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
    if not pending or not (pending["deliveries"] or pending["commands"]):
        return
    from .. import queue

    try:
        queue.announce(pending["deliveries"], pending["commands"])
    except Exception as exc:  # Redis down: the rows are committed, the relay will announce them.
        log.warning("could not announce %d deliveries / %d commands to Redis (%s); the relay will",
                    len(pending["deliveries"]), len(pending["commands"]), exc)
