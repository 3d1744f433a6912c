"""One use case = one transaction. `transaction()` commits the session (the state changes and
the outbox rows written beside them, in one commit), and only then tells Redis. Every use case
commits through it; `commit` and `rollback` are its parts. `once_per_key` answers an operator's
submission that lost the race for its request key with what the winner did."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy.exc import IntegrityError

from .. import queue
from ..extensions import db
from .announce import announce_or_leave_to_relay

Answer = TypeVar("Answer")


def once_per_key(attempt: Callable[[], Answer], earlier: Callable[[], Answer | None]) -> Answer:
    """An operator's submission done at most once per request key: `attempt()`, and when its
    commit lost to another with the same key (a double click racing itself: the key's unique
    index refused this one, which rolled back whole), what `earlier()` says the winner did. An
    IntegrityError that no earlier submission explains is raised."""
    try:
        return attempt()
    except IntegrityError:
        found = earlier()
        if found is None:
            raise
        return found


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


_GATHERED = "announce_after_batch"


def publish_after_commit(session) -> None:
    pending = session.info.pop("after_commit", None)
    if not pending or not (pending["deliveries"] or pending["commands"]):
        return
    gathered = session.info.get(_GATHERED)
    if gathered is not None:  # inside a drain's batch: told once, after the batch
        gathered["deliveries"].extend(pending["deliveries"])
        gathered["commands"].extend(pending["commands"])
        return
    _announce(pending)


def gather_announcements(session) -> None:
    """From now on this session's commits keep what they would tell Redis until
    `publish_gathered`: a drain running a batch of deadlines tells Redis once per batch, not once
    per row (a round trip that cost a tenth of an expiry's CPU). The rows are committed either
    way; what a crash before the publish loses, the scheduler's poll finds."""
    session.info.setdefault(_GATHERED, {"deliveries": [], "commands": []})


def publish_gathered(session) -> None:
    """Tell Redis what the commits since the last call made due, in one announcement."""
    gathered = session.info.get(_GATHERED)
    if gathered and (gathered["deliveries"] or gathered["commands"]):
        session.info[_GATHERED] = {"deliveries": [], "commands": []}
        _announce(gathered)


def _announce(pending: dict) -> None:
    announce_or_leave_to_relay(
        lambda: queue.announce(pending["deliveries"], pending["commands"]),
        "%d deliveries / %d commands committed",
        len(pending["deliveries"]),
        len(pending["commands"]),
    )
