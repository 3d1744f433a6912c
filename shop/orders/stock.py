"""An operator corrects a variant's stock, with a reason: from a shelf count, set it to a count,
or adjust it by a delta. Checkouts decrement the same row at any moment (`on_hand = on_hand - n WHERE on_hand >= n`),
so a correction never reads the count and writes back a number computed from it:

- `adjust` is one UPDATE `on_hand = on_hand + delta WHERE on_hand >= -delta` (and the result
  fits the column): a checkout that
  commits first is kept, and the correction applies on top of what it left;
- `set` is a compare-and-set, `on_hand = new WHERE on_hand = <the count the operator saw>`: if a
  checkout took stock since the page was shown the correction is refused (`changed`), with the
  count now, rather than silently undoing that sale. A set that names no count seen (a script)
  locks the row and replaces what it holds then, recording it as the old count;
- `count` is a shelf count: the shelf also holds what orders hold (`stock_held`), so on hand
  becomes the count less that, read in the same transaction. It is the same compare-and-set,
  guarded by the count seen and, when given, the held figure seen (a checkout moves units from
  one to the other); a count below what orders hold is refused (`below_held`).

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
from .stock_held import Held, held_by_orders

log = logging.getLogger("shop.orders")

_inventory = table_of(InventoryItem)


class StockMode(StrEnum):
    SET = "set"
    ADJUST = "adjust"
    COUNT = "count"  # a shelf count: on hand becomes it less what orders hold


CorrectionOutcome = SubmissionOutcome  # MISSING: no such variant, or it has no inventory row


@dataclass
class StockChange:
    """What `correct_stock` did. `why` for REFUSED: `no_reason`, `no_change` (a delta of 0, or
    the count it already is), `negative` (the stock would go below zero), `too_large`, `changed`
    (a set or count whose seen figures are no longer the figures), `below_held` (a shelf count
    below what orders hold). `on_hand` is the count now; `held` what orders hold (COUNT), read
    with it; `count` the shelf count a COUNT was given."""

    outcome: CorrectionOutcome
    variant_id: int
    why: str | None = None
    old: int | None = None
    new: int | None = None
    on_hand: int | None = None
    correction_id: int | None = None
    held: Held | None = None
    count: int | None = None


def _problem(mode: StockMode, value: int, seen: int | None, reason: str) -> str | None:
    if not reason:
        return "no_reason"
    if mode is StockMode.ADJUST and value == 0:
        return "no_change"
    if mode is not StockMode.ADJUST and value < 0:
        return "negative"
    if abs(value) > MAX_ON_HAND:
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
    seen_held: int | None = None,
) -> StockChange:
    """`value` is the new count (SET, guarded by `seen`, the count the operator was shown), the
    delta (ADJUST, + or -) or the shelf count (COUNT, guarded by `seen` and `seen_held`, what
    orders held when the operator was shown the figures)."""
    now = now or utcnow()
    reason = (reason or "").strip()
    asked = _Asked(StockMode(mode), value, seen, seen_held, reason)
    return uow.once_per_key(
        lambda: _correct_once(variant_id, asked, operator, request_key, now),
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


@dataclass(frozen=True)
class _Asked:
    mode: StockMode
    value: int
    seen: int | None
    seen_held: int | None
    reason: str


def _target(asked: _Asked, on_hand: int, seen: int | None, held: Held | None) -> tuple[int, str | None]:
    """The count on hand should become (SET, COUNT) or the delta (ADJUST), or why not."""
    mode, value = asked.mode, asked.value
    problem = _problem(mode, value, seen, asked.reason)
    if problem is not None or mode is StockMode.ADJUST:
        return value, problem
    if on_hand != seen or held is not None and asked.seen_held not in (None, held.total):
        return value, "changed"
    target = value
    if held is not None:
        if value < held.total:
            return value, "below_held"
        target = value - held.total
    return target, "no_change" if target == seen else None


def _update(variant_id: int, asked: _Asked, target: int, seen: int | None, now: datetime):
    if asked.mode is StockMode.ADJUST:
        return (
            update(_inventory)
            .where(
                _inventory.c.variant_id == variant_id,
                # The bound on the constant's side, within the column's range: on_hand + target
                # itself would overflow PostgreSQL's integer before the comparison could refuse it.
                _inventory.c.on_hand >= -target if target < 0 else _inventory.c.on_hand <= MAX_ON_HAND - target,
            )
            .values(on_hand=_inventory.c.on_hand + target, updated_at=now)
        )
    return (
        update(_inventory)
        .where(_inventory.c.variant_id == variant_id, _inventory.c.on_hand == seen)
        .values(on_hand=target, updated_at=now)
    )


def _on_hand(session, variant_id: int, *, lock: bool = False) -> int:
    query = select(InventoryItem.on_hand).where(InventoryItem.variant_id == variant_id)
    return session.execute(query.with_for_update() if lock else query).scalar_one()


def _correct_once(variant_id: int, asked: _Asked, operator, request_key, now) -> StockChange:
    mode = asked.mode
    with uow.transaction() as session:
        earlier = _earlier(request_key)
        if earlier is not None:
            return earlier
        current = session.execute(select(InventoryItem.on_hand).where(InventoryItem.variant_id == variant_id)).first()
        if current is None or session.get(Variant, variant_id) is None:
            return StockChange(CorrectionOutcome.MISSING, variant_id)
        on_hand, seen = current.on_hand, asked.seen
        if mode is not StockMode.ADJUST and seen is None:
            # A count set without the count it replaces: the row is locked and the set applies to
            # what it holds now (a checkout that committed first is in the `old` it records).
            on_hand = seen = _on_hand(session, variant_id, lock=True)
        held = held_by_orders(variant_id) if mode is StockMode.COUNT else None
        target, problem = _target(asked, on_hand, seen, held)
        if problem is not None:
            return StockChange(CorrectionOutcome.REFUSED, variant_id, problem, on_hand=on_hand, held=held)
        new = session.execute(
            _update(variant_id, asked, target, seen, now).returning(_inventory.c.on_hand)
        ).scalar_one_or_none()
        if new is None:
            why = "changed" if mode is not StockMode.ADJUST else ("negative" if target < 0 else "too_large")
            return StockChange(CorrectionOutcome.REFUSED, variant_id, why, on_hand=_on_hand(session, variant_id))
        old = new - target if mode is StockMode.ADJUST else seen
        assert old is not None
        row = StockCorrection(
            variant_id=variant_id,
            operator=operator,
            mode=mode.value,
            old_on_hand=old,
            new_on_hand=new,
            reason=asked.reason,
            request_key=request_key,
            created_at=now,
        )
        session.add(row)
        session.flush()
        log.warning(
            "variant %s: stock corrected by %s from %s to %s (%s)", variant_id, operator, old, new, asked.reason
        )
        count = asked.value if mode is StockMode.COUNT else None
        return StockChange(
            CorrectionOutcome.DONE,
            variant_id,
            old=old,
            new=new,
            on_hand=new,
            correction_id=row.id,
            held=held,
            count=count,
        )
