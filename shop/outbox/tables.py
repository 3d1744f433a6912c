"""The models' Core tables and a data-changing statement's row count, narrowed for the type checker.

A declarative model's `__table__` (and its mapper's `local_table`) is typed as any FromClause (a
join or a subquery could be mapped too), and `Session.execute` as returning a plain Result. The
shop maps every model onto one Table and reads row counts only of UPDATE, INSERT and DELETE
statements, whose results are CursorResults: these two checks say so once, and fail loudly if
that ever stops being true. In the outbox, the lowest layer above the models, so that the outbox,
the order store and the use cases above them can all use it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, inspect
from sqlalchemy.engine import CursorResult, Result


def table_of(model: type) -> Table:
    """The Table a model is mapped onto (its `__table__`), for Core statements on it."""
    table = inspect(model).local_table
    if not isinstance(table, Table):
        raise TypeError(f"{model.__name__} is not mapped onto a single table")
    return table


def rows_matched(result: Result[Any]) -> int:
    """How many rows an UPDATE, INSERT or DELETE run through `Session.execute` matched: its
    CursorResult's rowcount (Session.execute is typed as returning any Result)."""
    if not isinstance(result, CursorResult):
        raise TypeError(f"a {type(result).__name__} has no row count: not a data-changing statement's result")
    return result.rowcount
