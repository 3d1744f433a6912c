"""An operator corrects a variant's stock, with a reason: set it to a count, or adjust it by a
delta. Checkouts decrement the same row at any moment (`on_hand = on_hand - n WHERE on_hand >= n`),
so a correction never reads the count and writes back a number computed from it:

- `adjust` is one UPDATE `on_hand = on_hand + delta WHERE on_hand + delta >= 0`: a checkout that
  commits first is kept, and the correction applies on top of what it left;
- `set` is a compare-and-set, `on_hand = new WHERE on_hand = <the count the operator saw>`: if a
  checkout took stock since the page was shown the correction is refused (`changed`), with the
  count now, rather than silently undoing that sale. A set that names no count seen (a script)
  locks the row and replaces what it holds then, recording it as the old count.

Each correction is one row of `stock_corrections` (who, when, old -> new, why) in the same
transaction, named by the submission's key: the same click sent twice corrects once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import select, update

from ..domain.deadlines import utcnow
from ..domain.restoration import MAX_ON_HAND
from ..domain.results import SubmissionOutcome
from ..extensions import db
from ..models import InventoryItem, StockCorrection, Variant
from ..outbox import uow
from ..outbox.tables import table_of

log = logging.getLogger("shop.orders")

_inventory = table_of(InventoryItem)


class StockMode(StrEnum):
    SET = "set"
    ADJUST = "adjust"


CorrectionOutcome = SubmissionOutcome  # MISSING: no such variant, or it has no inventory row


@dataclass
class StockChange:
    """What `correct_stock` did. `why` for REFUSED: `no_reason`, `no_change` (a delta of 0, or
    the count it already is), `negative` (the stock would go below zero), `too_large`, `changed`
    (a set whose seen count is no longer the count). `on_hand` is the count now."""

    outcome: CorrectionOutcome
    variant_id: int
    why: str | None = None
    old: int | None = None
    new: int | None = None
    on_hand: int | None = None
    correction_id: int | None = None


def _problem(mode: StockMode, value: int, seen: int | None, reason: str) -> str | None:
    if not reason:
        return "no_reason"
    if mode is StockMode.ADJUST and value == 0:
        return "no_change"
    if mode is StockMode.SET and value < 0:
        return "negative"
    if mode is StockMode.SET and value > MAX_ON_HAND or mode is StockMode.ADJUST and abs(value) > MAX_ON_HAND:
        return "too_large"
    return None


def correct_stock(
    variant_id: int,
    *,
    mode: StockMode,
    value: int,
    seen: int | None,
    reason: str,
    operator: str,
    request_key: str,
    now: datetime | None = None,
) -> StockChange:
    """`value` is the new count (SET, guarded by `seen`, the count the operator was shown) or the
    delta (ADJUST, + or -)."""
    now = now or utcnow()
    reason = (reason or "").strip()
    return uow.once_per_key(
        lambda: _correct_once(variant_id, StockMode(mode), value, seen, reason, operator, request_key, now),
        lambda: _earlier(request_key),
    )


def _earlier(request_key: str) -> StockChange | None:
    row = db.session.execute(
        select(StockCorrection).where(StockCorrection.request_key == request_key)
    ).scalar_one_or_none()
    if row is None:
        return None
    on_hand = db.session.execute(select(InventoryItem.on_hand).where(InventoryItem.variant_id == row.variant_id))
    return StockChange(
        CorrectionOutcome.ALREADY,
        row.variant_id,
        old=row.old_on_hand,
        new=row.new_on_hand,
        on_hand=on_hand.scalar_one_or_none(),
        correction_id=row.id,
    )


def _correct_once(variant_id, mode, value, seen, reason, operator, request_key, now) -> StockChange:
    with uow.transaction() as session:
        earlier = _earlier(request_key)
        if earlier is not None:
            return earlier
        current = session.execute(select(InventoryItem.on_hand).where(InventoryItem.variant_id == variant_id)).first()
        if current is None or session.get(Variant, variant_id) is None:
            return StockChange(CorrectionOutcome.MISSING, variant_id)
        if mode is StockMode.SET and seen is None:
            # A count set without the count it replaces: the row is locked and the set applies to
            # what it holds now (a checkout that committed first is in the `old` it records).
            seen = session.execute(
                select(InventoryItem.on_hand).where(InventoryItem.variant_id == variant_id).with_for_update()
            ).scalar_one()
        problem = _problem(mode, value, seen, reason)
        if problem is None and mode is StockMode.SET and value == seen:
            problem = "no_change"
        if problem is not None:
            return StockChange(CorrectionOutcome.REFUSED, variant_id, problem, on_hand=current.on_hand)
        if mode is StockMode.ADJUST:
            statement = (
                update(_inventory)
                .where(
                    _inventory.c.variant_id == variant_id,
                    _inventory.c.on_hand + value >= 0,
                    _inventory.c.on_hand + value <= MAX_ON_HAND,
                )
                .values(on_hand=_inventory.c.on_hand + value, updated_at=now)
            )
        else:
            statement = (
                update(_inventory)
                .where(_inventory.c.variant_id == variant_id, _inventory.c.on_hand == seen)
                .values(on_hand=value, updated_at=now)
            )
        new = session.execute(statement.returning(_inventory.c.on_hand)).scalar_one_or_none()
        if new is None:
            now_on_hand = session.execute(
                select(InventoryItem.on_hand).where(InventoryItem.variant_id == variant_id)
            ).scalar_one()
            why = "changed" if mode is StockMode.SET else ("negative" if value < 0 else "too_large")
            return StockChange(CorrectionOutcome.REFUSED, variant_id, why, on_hand=now_on_hand)
        old = new - value if mode is StockMode.ADJUST else seen
        row = StockCorrection(
            variant_id=variant_id,
            operator=operator,
            mode=mode.value,
            old_on_hand=old,
            new_on_hand=new,
            reason=reason,
            request_key=request_key,
            created_at=now,
        )
        session.add(row)
        session.flush()
        log.warning("variant %s: stock corrected by %s from %s to %s (%s)", variant_id, operator, old, new, reason)
        return StockChange(CorrectionOutcome.DONE, variant_id, old=old, new=new, on_hand=new, correction_id=row.id)
