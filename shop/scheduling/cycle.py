"""A sweep cycle's record: what it counts (the passes' outcomes), its result (`CycleResult`), the
row in `reconciliation_cycles` (started, finished, or skipped), its errors as codes, and the
lines an operator reads (`expiry_line`, `provider_line`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm.exc import StaleDataError

from ..extensions import db
from ..models import Order, ReconciliationCycle
from ..outbox import uow
from ..payments import gateway

log = logging.getLogger("shop.sweep")

EXPIRY_OUTCOMES = ("cancelled", "lost_race", "changed", "errors")
PROVIDER_OUTCOMES = (
    "paid",
    "payment_failed",
    "cancelled",
    "proof_refused",
    "open",
    "awaiting_async",
    "refund_created",
    "late_refund",
    "refund_under_way",
    "refund_retried",
    "refund_refused",
    "refund_succeeded",
    "refund_failed",
    "watch_closed",
    "changed",
    "unavailable",
    "errors",
)


def zeros(keys) -> dict:
    return {k: 0 for k in keys}


@dataclass
class CycleResult:
    status: str  # ok | failed | skipped
    cutoff: datetime
    started_at: datetime
    finished_at: datetime | None = None
    cycle_id: int | None = None
    expiry: dict | None = None  # counts by outcome; None when the pass is turned off
    provider: dict | None = None
    errors: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # not errors: what an operator should still know
    reason: str = ""

    def summary(self) -> dict:
        return {
            "cycle_id": self.cycle_id,
            "status": self.status,
            "reason": self.reason,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "cutoff": self.cutoff.isoformat(),
            "expiry": dict(self.expiry) if self.expiry is not None else None,
            "provider": dict(self.provider) if self.provider is not None else None,
            "errors": list(self.errors),
            "notes": list(self.notes),
        }

    def report_lines(self) -> list[str]:
        head = f"cycle {self.cycle_id if self.cycle_id is not None else '-'}: {self.status}"
        head += f" (cutoff {self.cutoff.isoformat(timespec='seconds')})"
        if self.reason:
            head += f": {self.reason}"
        lines = [head]
        if self.status == "skipped":
            return lines
        lines.append(expiry_line(self.expiry))
        lines.append(provider_line(self.provider))
        lines += [f"note: {note}" for note in self.notes]
        for error in self.errors:
            where = f"order {error.get('reference') or error['order_id']} " if error.get("order_id") is not None else ""
            lines.append(f"error: {where}({error.get('pass', 'cycle')} pass): {error['error']}")
        return lines


def _extras(counts: dict, shown: tuple, labels: dict) -> list[str]:
    return [f"{n} {labels.get(k, k.replace('_', ' '))}" for k, n in counts.items() if k not in shown and n]


def expiry_line(counts: dict | None) -> str:
    if counts is None:
        return "expiry pass: off (UNPAID_ORDER_EXPIRY_ENABLED=false)"
    parts = [f"{counts.get('cancelled', 0)} cancelled", f"{counts.get('lost_race', 0)} lost races"]
    parts += _extras(counts, ("cancelled", "lost_race"), {"changed": "changed meanwhile"})
    return "expiry pass: " + ", ".join(parts)


def provider_line(counts: dict | None) -> str:
    if counts is None:
        return "provider pass: off (RECONCILIATION_ENABLED=false)"
    shown = ("paid", "payment_failed", "unavailable")
    parts = [
        f"{counts.get('paid', 0)} paid",
        f"{counts.get('payment_failed', 0)} payment failed",
        f"{counts.get('unavailable', 0)} unavailable",
    ]
    parts += _extras(
        counts,
        shown,
        {
            "open": "still open",
            "changed": "changed meanwhile",
            "awaiting_async": "awaiting an async payment",
            "cancelled": "cancelled (session expired at the end of the window)",
            "late_refund": "refunds for money that reached a cancelled order",
            "refund_under_way": "late-money refunds still under way (watched)",
            "refund_retried": "dead late-money refunds run again",
            "refund_refused": "late-money refunds refused by the provider (for an operator)",
            "refund_succeeded": "pending late-money refunds the provider says succeeded",
            "refund_failed": "pending late-money refunds the provider says failed (for an operator)",
            "watch_closed": "cancelled orders no longer watched for late money",
            "event_pages": "pages of the provider's events read for many orders in doubt at once",
            "woken": "rows that waited for the provider run now (it answers again)",
        },
    )
    return "provider pass: " + ", ".join(parts)


def error_kind(exc: BaseException) -> str:
    """A stable code for what went wrong, so the console can say it in words and group repeats
    without parsing exception text."""
    if isinstance(exc, gateway.ProviderRefused):
        return "provider_refused"
    if isinstance(exc, gateway.ProviderUnavailable):
        return "provider_unavailable"
    if isinstance(exc, StaleDataError):
        return "conflict"
    if isinstance(exc, SQLAlchemyError):
        return "database"
    return "unexpected"


def order_error(name: str, order_id: int, exc: BaseException) -> dict:
    """One order's failure as recorded in ReconciliationCycle.errors: the pass, the order (its id
    and, for the operator, its reference), a kind code and the exception's text. Reading the
    reference is best effort: a failure of the database itself must not stop the cycle here."""
    reference = None
    try:
        reference = db.session.execute(select(Order.reference).where(Order.id == order_id)).scalar()
        db.session.rollback()
    except Exception:
        uow.rollback(db.session)
    return {
        "pass": name,
        "order_id": order_id,
        "reference": reference,
        "kind": error_kind(exc),
        "error": f"{type(exc).__name__}: {exc}"[:500],
    }


def record_start(result: CycleResult, holder: str) -> int:
    row = ReconciliationCycle(
        started_at=result.started_at,
        cutoff=result.cutoff,
        status="running",
        holder=holder,
        expiry_counts={},
        provider_counts={},
        errors=[],
        notes=result.notes,
    )
    db.session.add(row)
    db.session.commit()
    return row.id


def record_finish(result: CycleResult) -> None:
    session = db.session
    if result.cycle_id is None:
        return
    try:
        session.execute(
            update(ReconciliationCycle)
            .where(ReconciliationCycle.id == result.cycle_id)
            .values(
                status=result.status,
                finished_at=result.finished_at,
                expiry_counts=result.expiry or {},
                provider_counts=result.provider or {},
                errors=result.errors,
            )
            .execution_options(synchronize_session=False)
        )
        session.commit()
    except Exception:
        session.rollback()
        log.exception("sweep: could not record the end of cycle %s", result.cycle_id)


def record_skip(result: CycleResult, holder: str, clock) -> CycleResult:
    session = db.session
    result.finished_at = clock()
    try:
        row = ReconciliationCycle(
            started_at=result.started_at,
            finished_at=result.finished_at,
            cutoff=result.cutoff,
            status="skipped",
            holder=holder,
            expiry_counts={},
            provider_counts={},
            errors=[],
        )
        session.add(row)
        session.commit()
        result.cycle_id = row.id
    except Exception:
        session.rollback()
        log.exception("sweep: could not record a skipped cycle")
    return result
