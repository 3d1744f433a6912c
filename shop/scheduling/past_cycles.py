"""The sweep's past cycles as the console and the metrics read them: newest first, the latest, and
when the last one that went well finished."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from ..domain.deadlines import as_utc
from ..extensions import db
from ..models import CycleStatus, ReconciliationCycle

# Newest first; the id settles cycles that started at the same instant.
NEWEST_FIRST = (ReconciliationCycle.started_at.desc(), ReconciliationCycle.id.desc())


def latest_cycle() -> ReconciliationCycle | None:
    return db.session.execute(select(ReconciliationCycle).order_by(*NEWEST_FIRST).limit(1)).scalar_one_or_none()


def last_success_at() -> datetime | None:
    """When the last cycle that went well (`ok`) finished, in UTC; None while none has."""
    last_ok = db.session.execute(
        select(func.max(ReconciliationCycle.finished_at)).where(ReconciliationCycle.status == CycleStatus.OK)
    ).scalar()
    return as_utc(last_ok) if last_ok else None
