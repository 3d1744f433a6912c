"""Compensation for a cancelled order: give its stock back exactly once.

Sequential redeliveries are stopped by the marker (orders.inventory_restored), which commits in
the same transaction as the increments it guards. Concurrent deliveries that both read the
marker as unset are stopped by the order's version: the marker is written FIRST, as an UPDATE
... WHERE version = <read>, so the second one fails on the order row before it touches any
stock, rolls back, and its retry finds the marker.

This is the hottest handler (every cancellation, every expired deadline), so it talks to the
tables directly: one SELECT reads the order's state, its lines and their stock; the marker, the
increments and the warnings are prebuilt statements with bound parameters. The decisions stay in
the domain: the marker's guard is `OrderRules.mark_inventory_restored` on a snapshot of the
row, and what to give back is `plan_restoration`. Loading and flushing the mapped Order cost
more CPU than everything else the delivery does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm.exc import StaleDataError

from .. import failpoints
from ..domain.events import OrderCancelled
from ..domain.order import OrderRules, OrderStatus
from ..domain.restoration import plan_restoration
from ..extensions import db
from ..models import InventoryItem, Order, OrderLine, RestoreWarning

log = logging.getLogger("shop.saga")

_orders, _lines, _inventory = Order.__table__, OrderLine.__table__, InventoryItem.__table__
_warnings = RestoreWarning.__table__

# The order's state, its lines and their inventory rows, in one consistent read. Soft-deleted
# inventory rows included on purpose: a retired variant's stock still belongs to its row.
_READ = (
    select(_orders.c.reference, _orders.c.status, _orders.c.inventory_restored, _orders.c.version,
           _lines.c.variant_id, _lines.c.quantity, _inventory.c.on_hand)
    .select_from(_orders.outerjoin(_lines, _lines.c.order_id == _orders.c.id)
                 .outerjoin(_inventory, _inventory.c.variant_id == _lines.c.variant_id))
    .where(_orders.c.id == bindparam("order_id")).order_by(_lines.c.id)
)
# The marker, guarded by the version read above (the mapped class's optimistic-concurrency
# token, bumped like every other update of the row).
_MARK = (update(_orders).where(_orders.c.id == bindparam("order_id"), _orders.c.version == bindparam("seen"))
         .values(inventory_restored=True, version=_orders.c.version + 1,
                 updated_at=bindparam("now", type_=_orders.c.updated_at.type)))
_INCREMENT = (update(_inventory).where(_inventory.c.variant_id == bindparam("variant"))
              .values(on_hand=_inventory.c.on_hand + bindparam("quantity"),
                      updated_at=bindparam("now", type_=_inventory.c.updated_at.type)))
_WARN = insert(_warnings)

_REFUSAL_WORDS = {
    "stock_would_overflow": "variant {variant}'s stock would go over the maximum an inventory row holds",
    "non_positive_quantity": "variant {variant} has an order line with a quantity of zero or less",
}


def _refusal_words(code: str) -> str:
    """`stock_would_overflow:variant=2` -> words an operator can act on (the code stays in them)."""
    name, _, rest = code.partition(":")
    variant = rest.partition("=")[2] or "?"
    return _REFUSAL_WORDS.get(name, name).format(variant=variant) + f" ({code})"


@dataclass
class _OrderSnapshot(OrderRules):
    """The part of the aggregate the marker's guard reads, as read by `_READ`."""

    id: int
    reference: str
    status: str
    inventory_restored: bool
    version: int
    payment_session_id: str | None = field(default=None)


def restore_inventory(event: OrderCancelled, now: datetime) -> str:
    session = db.session
    rows = session.execute(_READ, {"order_id": event.order_id}).all()
    if not rows:
        log.warning("restore_inventory: order %s from OrderCancelled no longer exists", event.order_id)
        return "gone"
    reference, status, restored, version = rows[0][:4]
    order = _OrderSnapshot(event.order_id, reference, status, bool(restored), version)
    if order.inventory_restored:
        return "already_restored"
    if OrderStatus(order.status) is not OrderStatus.CANCELLED:
        log.warning("restore_inventory: order %s is %s, not Cancelled; nothing restored", reference, status)
        return "not_cancelled"

    lines = [(variant_id, quantity) for *_, variant_id, quantity, _ in rows if variant_id is not None]
    on_hand = {variant_id: stock for *_, variant_id, _, stock in rows if variant_id is not None and stock is not None}
    plan = plan_restoration(lines, on_hand)

    if plan.refused:
        # Nothing is saved (no marker, no stock); the warning is the record, and an operator
        # retries after fixing the cause. Not retried automatically: it would refuse again.
        reason = ("nothing given back for this order, because " + "; ".join(_refusal_words(r) for r in plan.refusals)
                  + ". Fix the stock by hand and resolve, or fix the cause and retry the restore.")
        session.execute(_WARN, dict(order_id=order.id, variant_id=None, quantity=sum(q for _, q in lines),
                                    reason=reason, created_at=now))
        log.warning("restore_inventory: order %s (OrderCancelled): %s", reference, reason)
        return "refused"

    marked = order.mark_inventory_restored()
    if not marked.ok:
        log.warning("restore_inventory: order %s: %s", reference, marked.message)
        return marked.code
    # The marker first: a concurrent delivery that read the same version loses here, on the
    # order row, before it touches any stock.
    if session.execute(_MARK, {"order_id": order.id, "seen": version, "now": now}).rowcount != 1:
        raise StaleDataError(f"order {reference} changed while its stock was being restored "
                             f"(version {version} is stale); the next attempt finds the marker")
    failpoints.hit("restore_inventory.after_marker_flush")

    if plan.increases:
        # One executemany (one round trip on psycopg), still one row at a time in ascending
        # variant id order, like checkout's decrements: no lock-order cycles.
        session.execute(_INCREMENT, [{"variant": variant_id, "quantity": quantity, "now": now}
                                     for variant_id, quantity in sorted(plan.increases.items())])
    for variant_id, quantity in sorted(plan.unmatched.items()):
        # The marker still commits: withholding it would re-apply every matched line next time.
        session.execute(_WARN, dict(order_id=order.id, variant_id=variant_id, quantity=quantity,
                                    reason="no inventory row for this variant; quantity not restored",
                                    created_at=now))
        log.warning("restore_inventory: order %s (OrderCancelled): variant %s has no inventory row, "
                    "%d unit(s) not restored", reference, variant_id, quantity)
    log.info("restore_inventory: order %s restored %s", reference, dict(plan.increases))
    return "restored"
def restore_inventory_now(order_id: int) -> str:
    """Run the compensation directly in its own transaction (operator retry, tests)."""
    from ..domain.deadlines import utcnow
    from ..outbox import uow

    with uow.transaction():
        return restore_inventory(OrderCancelled(order_id, "operator retry"), utcnow())
