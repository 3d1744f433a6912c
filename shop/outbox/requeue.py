"""Rows of durable work moved outside a run (docs/REFERENCE.md, Console; docs/ARCHITECTURE.md,
Transactions), each in one conditional UPDATE and its own commit: a dead row run again with a fresh
attempt budget (one, or every one of a handler or command kind), the rows waiting only for the
provider made due now, and a row discarded. outbox.dispatch calls them and announces what became due."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update

from ..domain.deadlines import FAILURE_PROVIDER, utcnow
from ..extensions import db
from ..models import WorkStatus
from .tables import rows_matched
from .writer import fresh_budget


def _fresh_budget(now: datetime) -> dict:
    """A dead row run again by an operator: pending and due now, with a fresh attempt budget,
    its failures and its last claim forgotten."""
    return dict(**fresh_budget(now, now), failure_kind=None, provider_waits=0, claimed_by=None, claimed_until=None)


def retry_dead(model, work_id: int, now: datetime | None = None) -> bool:
    """Operator action: a dead row runs again with a fresh attempt budget."""
    now = now or utcnow()
    result = db.session.execute(
        update(model)
        .where(model.id == work_id, model.status == WorkStatus.DEAD)
        .values(**_fresh_budget(now))
        .execution_options(synchronize_session=False)
    )
    db.session.commit()
    return rows_matched(result) == 1


def retry_all_dead(model, name_column, name: str, now: datetime | None = None) -> list[int]:
    """Operator action after an outage: every dead row of one handler (or command kind) runs
    again with a fresh budget, in one conditional UPDATE. Returns the ids it moved."""
    now = now or utcnow()
    table = model.__table__
    ids = (
        db.session.execute(
            update(table)
            .where(table.c.status == WorkStatus.DEAD, name_column == name)
            .values(**_fresh_budget(now))
            .returning(table.c.id)
        )
        .scalars()
        .all()
    )
    db.session.commit()
    return sorted(ids)


def wake_provider_waiters(model, now: datetime) -> list[int]:
    """Rows backing off only because the provider did not answer become due now, in one
    conditional UPDATE (their attempt budget is untouched). Returns the ids it moved."""
    table = model.__table__
    ids = (
        db.session.execute(
            update(table)
            .where(
                table.c.status == WorkStatus.PENDING,
                table.c.failure_kind == FAILURE_PROVIDER,
                table.c.next_attempt_at > now,
            )
            .values(next_attempt_at=now, updated_at=now)
            .returning(table.c.id)
        )
        .scalars()
        .all()
    )
    db.session.commit()
    return sorted(ids)


def discard(model, work_id: int, reason: str, now: datetime | None = None) -> bool:
    now = now or utcnow()
    result = db.session.execute(
        update(model)
        .where(model.id == work_id, model.status.in_((WorkStatus.DEAD, WorkStatus.PENDING)))
        .values(
            status=WorkStatus.DISCARDED,
            discard_reason=reason,
            completed_at=now,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    db.session.commit()
    return rows_matched(result) == 1
