"""An operator's refund puts back a chosen number of each line's units (saga.operator_refunds).

In the refund's transaction, under its order's lock: per line, one conditional increment of the
line's `restocked` count (`restocked + n <= quantity`, so no unit is ever given back twice,
whatever submission or refund asks), one conditional increment of the variant's stock (never
past the row's maximum) that returns the stock after, and the refund's own record of the line
(`refund_restocks`, one per refund and line). Anything refused raises `RestockRefused`: the
transaction rolls back whole, refund included. When every unit of every line is back, the
order's marker is set too (the compensation's own, `restock_paid`): a later restore of the order
gives nothing back again, and one that runs before it gives back only what no refund did.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import bindparam, insert, select, update

from ..domain.order import Transition
from ..domain.restoration import MAX_ON_HAND
from ..domain.results import Refused
from ..extensions import db
from ..models import InventoryItem, OrderLine, RefundRestock
from ..outbox.tables import table_of
from ..store import order_store

_inventory, _lines, _records = table_of(InventoryItem), table_of(OrderLine), table_of(RefundRestock)

_INCREMENT = (
    update(_inventory)
    .where(
        _inventory.c.variant_id == bindparam("variant"),
        _inventory.c.on_hand + bindparam("units") <= MAX_ON_HAND,
    )
    .values(
        on_hand=_inventory.c.on_hand + bindparam("units"),
        updated_at=bindparam("now", type_=_inventory.c.updated_at.type),
    )
    .returning(_inventory.c.on_hand)
)


class RestockRefused(Exception):
    """Nothing can be put back as asked; the words say why (the refund's transaction rolls back)."""


@dataclass(frozen=True)
class LineLeft:
    """One order line as the refund form shows it: bought, already back, and what may still go back."""

    id: int
    variant_id: int
    sku: str
    name: str
    quantity: int
    restocked: int

    @property
    def left(self) -> int:
        return self.quantity - self.restocked


@dataclass(frozen=True)
class GivenBack:
    """Units of one line a refund put back, with the variant's stock before and after: the record
    kept of it, but for the refund and the variant (its fields are the record's columns)."""

    line_id: int
    sku: str
    quantity: int
    on_hand_before: int
    on_hand_after: int

    def words(self) -> str:
        return f"{self.quantity} × {self.sku} (stock {self.on_hand_before} → {self.on_hand_after})"


def lines_left(order_id: int) -> list[LineLeft]:
    """The order's lines, in order, with what each may still have put back."""
    rows = db.session.execute(select(_lines).where(_lines.c.order_id == order_id).order_by(_lines.c.id)).all()
    return [LineLeft(r.id, r.variant_id, r.sku, r.name, r.quantity, r.restocked) for r in rows]


def all_left(order_id: int) -> dict[int, int]:
    """Every unit not yet put back, by line (a `restock=yes` without quantities)."""
    return {line.id: line.left for line in lines_left(order_id) if line.left > 0}


def given_back(refund_id: int) -> list[GivenBack]:
    """What a refund put back (an earlier submission's answer names it again)."""
    rows = db.session.execute(
        select(_records).where(_records.c.refund_id == refund_id).order_by(_records.c.line_id)
    ).all()
    return [GivenBack(r.line_id, r.sku, r.quantity, r.on_hand_before, r.on_hand_after) for r in rows]


def restock_lines(order, refund_id: int, wanted: dict[int, int], now: datetime) -> list[GivenBack]:
    """Put back `wanted` ({line id: units}) of the locked, paid `order` for refund `refund_id`."""
    lines = {line.id: line for line in lines_left(order.id)}
    given: list[GivenBack] = []
    for line_id, quantity in sorted(wanted.items(), key=lambda item: (_variant(lines, item[0]), item[0])):
        if quantity <= 0:
            continue
        line = lines[line_id]
        if not order_store.count_restocked(order.id, line_id, quantity):
            raise RestockRefused(
                f"{quantity} × {line.sku} is more than can go back: "
                f"{line.quantity} bought, {line.restocked} back already"
            )
        after = db.session.execute(
            _INCREMENT, {"variant": line.variant_id, "units": quantity, "now": now}
        ).scalar_one_or_none()
        if after is None:
            raise RestockRefused(f"{line.sku} has no stock row, or its stock would go over the maximum a row holds")
        record = GivenBack(line_id, line.sku, quantity, after - quantity, after)
        db.session.execute(
            insert(_records),
            {"refund_id": refund_id, "variant_id": line.variant_id, **asdict(record)},
        )
        given.append(record)
    if given and all(lines[i].left - wanted.get(i, 0) <= 0 for i in lines):
        _mark_all_back(order, now)
    return given


def _variant(lines: dict[int, LineLeft], line_id: int) -> int:
    """Lines in ascending variant order, like checkout's decrements: no lock-order cycles."""
    if line_id not in lines:
        raise RestockRefused(f"line {line_id} is not a line of this order")
    return lines[line_id].variant_id


def _mark_all_back(order, now: datetime) -> None:
    marked = order.restock_paid()
    if isinstance(marked, Refused):
        raise RestockRefused(marked.message)
    order_store.save(order, Transition.RESTOCK_PAID, now=now)
