"""A row written at the first sighting of some money only: `refunds.record_late_payment` and
`unknown_sighting.record_unknown_payment` each see the same payment again (a redelivered notice,
the sweep after the webhook) and must write it once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import IntegrityError

_Row = TypeVar("_Row")


def add_once(session, already, make_row: Callable[[], _Row]) -> _Row | None:
    """`make_row()` added in a savepoint of the caller's transaction (flushed, so it has its id),
    or None when the select `already` finds the sighting recorded, or a concurrent sighting of the
    same unique key wins the insert."""
    if session.execute(already).first():
        return None
    try:
        with session.begin_nested():
            row = make_row()
            session.add(row)
    except IntegrityError:
        return None
    return row
