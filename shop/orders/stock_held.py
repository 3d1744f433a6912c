"""What a variant's orders hold of the units still on its shelf: a checkout takes stock from
`on_hand` at once, but the goods leave the shelf only when they are shipped. So a shelf count
is on hand plus what orders hold (docs/REFERENCE.md, the console's "Correcting stock"):

- `unpaid`: orders waiting for money (PendingPayment, PaymentInitiated, PaymentFailed);
- `paid`: paid orders not yet shipped (no `shipped_at`) whose stock was not put back (a refund
  with restock); a shipped order's goods have left the shelf;
- `returning`: cancelled orders whose stock the compensation has not given back yet (it adds
  the units to `on_hand` shortly). One with a restore warning is left out: its stock is the
  operator's to settle (the warning), and no compensation will add it back by itself.

One aggregate over the order lines of orders that have not given their stock back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import exists, func, or_, select

from ..domain.order import LIVE, OrderStatus
from ..extensions import db
from ..models import Order, OrderLine, RestoreWarning


@dataclass(frozen=True)
class Held:
    unpaid: int = 0
    paid: int = 0
    returning: int = 0

    @property
    def total(self) -> int:
        return self.unpaid + self.paid + self.returning

    def as_json(self) -> dict:
        return {**asdict(self), "total": self.total}


def held_by_orders(variant_id: int) -> Held:
    """The units of `variant_id` its orders hold, read in the session's transaction."""
    return held_by_variants([variant_id]).get(variant_id, Held())


def held_by_variants(variant_ids: list[int]) -> dict[int, Held]:
    """What orders hold of each of `variant_ids` (those holding nothing are left out), in one query."""
    if not variant_ids:
        return {}
    warned = exists().where(RestoreWarning.order_id == Order.id)
    rows = db.session.execute(
        select(OrderLine.variant_id, Order.status, func.coalesce(func.sum(OrderLine.quantity), 0))
        .join(OrderLine, OrderLine.order_id == Order.id)
        .where(
            OrderLine.variant_id.in_(variant_ids),
            Order.inventory_restored.is_(False),
            Order.shipped_at.is_(None),  # shipped: its goods left the shelf
            or_(Order.status != OrderStatus.CANCELLED, ~warned),
        )
        .group_by(OrderLine.variant_id, Order.status)
    ).all()
    by_variant: dict[int, dict[OrderStatus, int]] = {}
    for variant_id, status, quantity in rows:
        by_variant.setdefault(variant_id, {})[OrderStatus(status)] = int(quantity)
    return {
        variant_id: Held(
            unpaid=sum(by_status.get(s, 0) for s in LIVE),
            paid=by_status.get(OrderStatus.PAID, 0) + by_status.get(OrderStatus.AUTHORIZED, 0),
            returning=by_status.get(OrderStatus.CANCELLED, 0),
        )
        for variant_id, by_status in by_variant.items()
    }
