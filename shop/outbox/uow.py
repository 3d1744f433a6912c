"""One use case = one transaction. `transaction()` commits the session (the state changes and
the outbox rows written beside them, in one commit), and only then tells Redis. Every use case
commits through it; `commit` and `rollback` are its parts."""

from __future__ import annotations

from contextlib import contextmanager

from .. import queue
from ..extensions import db
from .announce import announce_or_leave_to_relay


def commit(session) -> None:
    """Commit the use case's transaction: its state changes and the outbox rows the order store
    wrote beside them (`store.order_store.save` writes a transition's events as it saves it)."""
    session.commit()


def rollback(session) -> None:
    """Roll back, and forget what the transaction would have told Redis, so nothing of an undone
    change reaches a later commit's announcement."""
    session.info.pop("after_commit", None)
    session.rollback()


@contextmanager
def transaction():
    """The one commit path of every use case: `with uow.transaction() as session:` ... on leaving
    the block everything commits together, the outbox rows included; only then is Redis told.
    Anything raised rolls it all back (events included), announces nothing, and is re-raised: a
    caller that retries (a lost version check) catches it outside the block and enters a fresh
    one. An announce that fails is only logged: the rows are committed and the
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
    if not pending or not (pending["deliveries"] or pending["commands"]):
        return
    announce_or_leave_to_relay(
        lambda: queue.announce(pending["deliveries"], pending["commands"]),
        "%d deliveries / %d commands committed",
        len(pending["deliveries"]),
        len(pending["commands"]),
    )
