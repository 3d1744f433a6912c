"""A sweep cycle's record: what it counts (the passes' outcomes), its result (`CycleResult`), the
row in `reconciliation_cycles` (started, finished, or skipped), its errors as codes, and the
lines an operator reads (`expiry_line`, `provider_line`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm.exc import StaleDataError

from ..extensions import db
from ..models import CycleStatus, Order, ReconciliationCycle
from ..outbox import uow
from ..provider import gateway

log = logging.getLogger("shop.sweep")


class PassName(StrEnum):
    """Where an error happened, as a recorded error's "pass" says it."""

    EXPIRY = "expiry"
    PROVIDER = "provider"
    CYCLE = "cycle"  # the cycle itself, outside any one order


class ExpiryOutcome(StrEnum):
    """What the expiry pass did with one order."""

    CANCELLED = "cancelled"
    LOST_RACE = "lost_race"
    CHANGED = "changed"


class ProviderOutcome(StrEnum):
    """What the provider pass (and its late-money watch) did with one order: the answer applied
    (`payments.apply`'s words, where they are the pass's), or what the pass made of it."""

    PAID = "paid"
    PAYMENT_FAILED = "payment_failed"
    CANCELLED = "cancelled"
    PROOF_REFUSED = "proof_refused"
    OPEN = "open"
    AWAITING_ASYNC = "awaiting_async"
    REFUND_CREATED = "refund_created"
    LATE_REFUND = "late_refund"
    REFUND_UNDER_WAY = "refund_under_way"
    REFUND_RETRIED = "refund_retried"
    REFUND_REFUSED = "refund_refused"
    REFUND_SUCCEEDED = "refund_succeeded"
    REFUND_FAILED = "refund_failed"
    WATCH_CLOSED = "watch_closed"
    CHANGED = "changed"
    UNAVAILABLE = "unavailable"  # the provider did not answer, or its breaker is open
    HELD_BACK = "held_back"  # not asked: the provider's rate budget (or this process's slots) spent
    # Answers the payment path can give that no cycle expects; counted as they come, not zeroed.
    DUPLICATE = "duplicate"
    UNKNOWN_ORDER = "unknown_order"
    AUTHORIZED = "authorized"  # CAPTURE_MODE=dispatch: the payment is held (payments.holds)
    VOID_CREATED = "void_created"


class Tally(StrEnum):
    """What a pass counts beside its orders' outcomes."""

    ERRORS = "errors"  # orders whose work raised
    EVENT_PAGES = "event_pages"  # pages of the provider's event list read (the in-doubt pass)
    WOKEN = "woken"  # rows that waited for the provider, run now
    MONEY_PAGES = "money_pages"  # pages of the provider's completed payments scanned (the unknown-money scan)


class ErrorKind(StrEnum):
    """A stable code for what went wrong, so the console can say it in words and group repeats
    without parsing exception text."""

    PROVIDER_REFUSED = "provider_refused"
    PROVIDER_UNAVAILABLE = "provider_unavailable"
    CONFLICT = "conflict"
    DATABASE = "database"
    UNEXPECTED = "unexpected"
    LEASE_LOST = "lease_lost"


E, P = ExpiryOutcome, ProviderOutcome
# The counts every cycle records, zero or not, in this order.
EXPIRY_OUTCOMES = (E.CANCELLED, E.LOST_RACE, E.CHANGED, Tally.ERRORS)
PROVIDER_OUTCOMES = (
    P.PAID,
    P.PAYMENT_FAILED,
    P.CANCELLED,
    P.PROOF_REFUSED,
    P.OPEN,
    P.AWAITING_ASYNC,
    P.REFUND_CREATED,
    P.LATE_REFUND,
    P.REFUND_UNDER_WAY,
    P.REFUND_RETRIED,
    P.REFUND_REFUSED,
    P.REFUND_SUCCEEDED,
    P.REFUND_FAILED,
    P.WATCH_CLOSED,
    P.CHANGED,
    P.UNAVAILABLE,
    P.HELD_BACK,
    Tally.ERRORS,
)
# Outcomes of a call that could not be made or answered: the order is asked again next cycle.
NOT_ASKED = frozenset({P.UNAVAILABLE, P.HELD_BACK})


def zeros(keys) -> dict:
    return {k: 0 for k in keys}


@dataclass
class CycleResult:
    status: CycleStatus
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
        if self.status is CycleStatus.SKIPPED:
            return lines
        lines.append(expiry_line(self.expiry))
        lines.append(provider_line(self.provider))
        lines += [f"note: {note}" for note in self.notes]
        for error in self.errors:
            where = f"order {error.get('reference') or error['order_id']} " if error.get("order_id") is not None else ""
            lines.append(f"error: {where}({error.get('pass', PassName.CYCLE)} pass): {error['error']}")
        return lines


def _extras(counts: dict, shown: tuple, labels: dict) -> list[str]:
    return [f"{n} {labels.get(k, k.replace('_', ' '))}" for k, n in counts.items() if k not in shown and n]


def expiry_line(counts: dict | None) -> str:
    if counts is None:
        return "expiry pass: off (UNPAID_ORDER_EXPIRY_ENABLED=false)"
    parts = [f"{counts.get(E.CANCELLED, 0)} cancelled", f"{counts.get(E.LOST_RACE, 0)} lost races"]
    parts += _extras(counts, (E.CANCELLED, E.LOST_RACE), {E.CHANGED: "changed meanwhile"})
    return "expiry pass: " + ", ".join(parts)


def provider_line(counts: dict | None) -> str:
    if counts is None:
        return "provider pass: off (RECONCILIATION_ENABLED=false)"
    shown = (P.PAID, P.PAYMENT_FAILED, P.UNAVAILABLE)
    parts = [
        f"{counts.get(P.PAID, 0)} paid",
        f"{counts.get(P.PAYMENT_FAILED, 0)} payment failed",
        f"{counts.get(P.UNAVAILABLE, 0)} unavailable",
    ]
    parts += _extras(
        counts,
        shown,
        {
            P.OPEN: "still open",
            P.CHANGED: "changed meanwhile",
            P.HELD_BACK: "not asked (the provider's rate budget was spent)",
            P.AWAITING_ASYNC: "awaiting an async payment",
            P.CANCELLED: "cancelled (session expired at the end of the window)",
            P.LATE_REFUND: "refunds for money that reached a cancelled order",
            P.REFUND_UNDER_WAY: "late-money refunds still under way (watched)",
            P.REFUND_RETRIED: "dead late-money refunds run again",
            P.REFUND_REFUSED: "late-money refunds refused by the provider (for an operator)",
            P.REFUND_SUCCEEDED: "pending late-money refunds the provider says succeeded",
            P.REFUND_FAILED: "pending late-money refunds the provider says failed (for an operator)",
            P.WATCH_CLOSED: "cancelled orders no longer watched for late money",
            Tally.EVENT_PAGES: "pages of the provider's events read for many orders in doubt at once",
            Tally.WOKEN: "rows that waited for the provider run now (it answers again)",
            Tally.MONEY_PAGES: "pages of the provider's completed payments scanned for money no order holds",
            P.UNKNOWN_ORDER: "payments for no order this shop knows (checked with the provider, then refunded)",
        },
    )
    return "provider pass: " + ", ".join(parts)


def not_asked(exc: gateway.ProviderUnavailable) -> ProviderOutcome:
    """The count of a provider call that could not be made or answered: held back when the
    shop's guard or the provider's 429 said the rate budget (or this process's slots) was spent,
    as the provider itself may be fine; unavailable otherwise."""
    return P.HELD_BACK if exc.kind in gateway.BUDGET_KINDS else P.UNAVAILABLE


def not_answered(exc: gateway.ProviderUnavailable, about: str) -> ProviderOutcome:
    """`not_asked`, logged with what the call was `about`."""
    outcome = not_asked(exc)
    if outcome is P.HELD_BACK:
        log.info("sweep: not asked about %s, the provider's rate budget is spent: %s; asked next cycle", about, exc)
    else:
        log.info("sweep: provider unreachable about %s: %s; asked next cycle", about, exc)
    return outcome


def error_kind(exc: BaseException) -> ErrorKind:
    """What went wrong, as its stable code (see ErrorKind)."""
    if isinstance(exc, gateway.ProviderRefused):
        return ErrorKind.PROVIDER_REFUSED
    if isinstance(exc, gateway.ProviderUnavailable):
        return ErrorKind.PROVIDER_UNAVAILABLE
    if isinstance(exc, StaleDataError):
        return ErrorKind.CONFLICT
    if isinstance(exc, SQLAlchemyError):
        return ErrorKind.DATABASE
    return ErrorKind.UNEXPECTED


def order_error(name: PassName, order_id: int, exc: BaseException) -> dict:
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


def _new_row(result: CycleResult, holder: str, status: CycleStatus, **more) -> ReconciliationCycle:
    return ReconciliationCycle(
        started_at=result.started_at,
        cutoff=result.cutoff,
        status=status,
        holder=holder,
        expiry_counts={},
        provider_counts={},
        errors=[],
        **more,
    )


def record_start(result: CycleResult, holder: str) -> int:
    row = _new_row(result, holder, CycleStatus.RUNNING, notes=result.notes)
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
        row = _new_row(result, holder, CycleStatus.SKIPPED, finished_at=result.finished_at)
        session.add(row)
        session.commit()
        result.cycle_id = row.id
    except Exception:
        session.rollback()
        log.exception("sweep: could not record a skipped cycle")
    return result
