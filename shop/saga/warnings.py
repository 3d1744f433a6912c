"""An operator's answers to a restore warning (docs/REFERENCE.md, Console): the stock was fixed by
hand, or the compensation runs again. The console's route keeps the request and the answer; the
writes to `restore_warnings` are here, each conditional on the warning still being open, so two
operators cannot both settle it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update

from ..extensions import db
from ..models import Order, RestoreWarning, WarningState
from ..outbox.tables import rows_matched
from .inventory import RestoreOutcome, restore_inventory_now

log = logging.getLogger("shop.console")


def _settle(warning_id: int, state: WarningState, resolution: str, resolved_at: datetime | None) -> bool:
    """Write the warning's state and resolution, if it is still open (None: it stays open)."""
    result = db.session.execute(
        update(RestoreWarning)
        .where(RestoreWarning.id == warning_id, RestoreWarning.state == WarningState.OPEN)
        .values(state=state, resolution=resolution[:4000], resolved_at=resolved_at)
        .execution_options(synchronize_session=False)
    )
    db.session.commit()
    return rows_matched(result) == 1


def resolve_fixed_by_hand(warning_id: int, stamp: str, note: str, now: datetime) -> bool:
    """The operator corrected the stock by hand: the warning closes with their note. False when
    it was settled meanwhile."""
    return _settle(warning_id, WarningState.RESOLVED, f"fixed by hand ({stamp})" + (f": {note}" if note else ""), now)


@dataclass(frozen=True)
class RetryResult:
    """What a retried restore did to the warning: `resolved` (closed), `lost` (someone settled it
    meanwhile), or left open; `outcome` is the compensation's own word (ERROR when the retry
    raised, `error` then saying what), `words` the rest of the story as the resolution says it,
    `fresh` whether the retry wrote warnings of its own."""

    outcome: RestoreOutcome
    words: str
    resolved: bool = False
    lost: bool = False
    fresh: bool = False
    error: str = ""


def retry_restore(warning_id: int, stamp: str, now: datetime) -> RetryResult:
    """Run the compensation of the warning's order again. The warning closes only if the order's
    stock is now restored and what it names can be restored at all; otherwise it stays open
    with what happened."""
    warning = db.session.get(RestoreWarning, warning_id)
    assert warning is not None, warning_id  # the console retries only a warning it found
    order_id, variant_id = warning.order_id, warning.variant_id
    # The newest warning now (this one at the least): what the retry writes comes after it.
    newest_before = db.session.execute(select(func.max(RestoreWarning.id))).scalar_one()
    db.session.rollback()
    outcome, error = _restore(warning_id, order_id)
    order = db.session.get(Order, order_id)
    restored = order is not None and bool(order.inventory_restored)
    # Warnings the retry itself wrote for this order: the same problem again, or what is left.
    fresh = (
        db.session.execute(
            select(RestoreWarning)
            .where(RestoreWarning.order_id == order_id, RestoreWarning.id > newest_before)
            .order_by(RestoreWarning.id)
        )
        .scalars()
        .all()
    )
    # An "unmatched variant" warning names a variant whose stock a retry can never bring back:
    # the order's marker was committed with the other lines.
    cause_remains = variant_id is not None and outcome is RestoreOutcome.ALREADY_RESTORED
    if restored and not cause_remains:
        words = _said(outcome, error)
        words += "".join(
            f"; still missing: {w.quantity} unit(s) of variant {w.variant_id} (warning {w.id})" for w in fresh
        )
        settled = _settle(warning_id, WarningState.RESOLVED, f"retried ({stamp}): {words}", now)
        return RetryResult(outcome, words, resolved=settled, lost=not settled, fresh=bool(fresh), error=error)
    what = _why_still_open(outcome, error, variant_id, cause_remains)
    # The retry's own copy of the same problem would count it twice: it is folded into this one.
    for w in fresh:
        if w.variant_id == variant_id and w.state == WarningState.OPEN:
            db.session.execute(
                update(RestoreWarning)
                .where(RestoreWarning.id == w.id, RestoreWarning.state == WarningState.OPEN)
                .values(
                    state=WarningState.DUPLICATE, resolution=f"same problem as warning {warning_id}", resolved_at=now
                )
            )
    db.session.commit()
    _settle(warning_id, WarningState.OPEN, f"retry ({stamp}): {what}", None)
    return RetryResult(outcome, what, fresh=bool(fresh), error=error)


def _restore(warning_id: int, order_id: int) -> tuple[RestoreOutcome, str]:
    """The compensation's outcome, and what went wrong when it raised (else "")."""
    error = ""
    try:
        outcome = restore_inventory_now(order_id)
    except Exception as exc:  # e.g. a worker restored the same order at the same moment
        db.session.rollback()
        log.warning("operator retry of restore for warning %s failed: %s", warning_id, exc)
        outcome, error = RestoreOutcome.ERROR, f"{type(exc).__name__}: {exc}"
    db.session.rollback()
    return outcome, error


# What the resolution (an operator reads it on the console) says of each outcome.
_OUTCOME_WORDS = {
    RestoreOutcome.RESTORED: "stock restored",
    RestoreOutcome.ALREADY_RESTORED: "the stock had already been restored",
    RestoreOutcome.NOT_CANCELLED: "the order is not cancelled, so there is no stock to give back",
    RestoreOutcome.REFUSED: "refused by an inventory invariant",
    RestoreOutcome.GONE: "the order no longer exists",
    RestoreOutcome.ORDER_NOT_CANCELLED: "the order is not cancelled, so there is no stock to give back",
    RestoreOutcome.INVENTORY_ALREADY_RESTORED: "the stock had already been restored",
    RestoreOutcome.ERROR: "the retry failed",
}


def _said(outcome: RestoreOutcome, error: str) -> str:
    """An outcome in the resolution's words, and for an error what went wrong."""
    words = _OUTCOME_WORDS[outcome]
    return f"{words} ({error})" if outcome is RestoreOutcome.ERROR else words


def _why_still_open(outcome: RestoreOutcome, error: str, variant_id: int | None, cause_remains: bool) -> str:
    if cause_remains:
        return (
            f"the order's other lines were restored earlier; variant {variant_id} has no inventory row, so a "
            "retry cannot bring these units back. Add the stock by hand, then choose “fixed”"
        )
    if outcome is RestoreOutcome.REFUSED:
        return "refused again by an inventory invariant; fix the cause first"
    return _said(outcome, error)
