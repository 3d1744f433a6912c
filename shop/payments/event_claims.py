"""A provider event applied once (docs/REFERENCE.md, Webhook): its id claimed in the caller's
transaction, one row in `processed_stripe_events` per event, so a redelivered event finds its claim
and does nothing (apply.py's `apply_session`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from ..models import ProcessedStripeEvent
from ..outbox.tables import table_of


def claim_event(session, event_id: str, now: datetime) -> bool:
    """Insert the event's dedup row in the caller's transaction; False when it is already there.

    One statement instead of a SELECT then an INSERT: `ON CONFLICT DO NOTHING` on PostgreSQL and
    SQLite (a concurrent first delivery holding the same key makes PostgreSQL wait for its
    outcome, so exactly one of them applies the event), a SAVEPOINT around a plain INSERT
    elsewhere."""
    values = {"event_id": event_id, "processed_at": now}
    claim = claim_statement(session.get_bind().dialect.name)
    if claim is not None:
        return session.execute(claim, values).first() is not None
    try:
        with session.begin_nested():
            session.execute(insert(table_of(ProcessedStripeEvent)), values)
    except IntegrityError:
        return False
    return True


_CLAIMS: dict = {}


def claim_statement(dialect: str):
    """Built once per dialect and executed with parameters: building the statement on every
    delivery cost about as much CPU as running it. RETURNING says whether a row went in
    (SQLAlchemy does not keep an INSERT's rowcount; psycopg's reads -1)."""
    if dialect not in _CLAIMS:
        upsert = {"postgresql": postgresql_insert, "sqlite": sqlite_insert}.get(dialect)
        table = ProcessedStripeEvent.__table__
        _CLAIMS[dialect] = upsert and upsert(table).on_conflict_do_nothing(index_elements=["event_id"]).returning(
            table.c.event_id
        )
    return _CLAIMS[dialect]
