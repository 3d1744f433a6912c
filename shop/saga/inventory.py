"""Compensation for a cancelled order: give its stock back exactly once.

Sequential redeliveries are stopped by the marker (Order.inventory_restored), which commits in
the same transaction as the increments it guards. Concurrent deliveries that both read the
marker as unset are stopped by the order's version: the marker is flushed FIRST, as an UPDATE
... WHERE version = <loaded>, so the second one fails on the order row before it touches any
stock, rolls back, and its retry finds the marker.
"""
from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import bindparam, select, update

from .. import failpoints
from ..domain.events import OrderCancelled
from ..domain.order import OrderStatus
from ..domain.restoration import plan_restoration
from ..extensions import db
from ..models import InventoryItem, Order, OrderLine, RestoreWarning

log = logging.getLogger("shop.saga")


_inventory = InventoryItem.__table__
_INCREMENT = (update(_inventory).where(_inventory.c.variant_id == bindparam("variant"))
              .values(on_hand=_inventory.c.on_hand + bindparam("quantity"), updated_at=bindparam("now")))


def restore_inventory(event: OrderCancelled, now: datetime) -> str:
    session = db.session
    order = session.get(Order, event.order_id)
    if order is None:
        log.warning("restore_inventory: order %s from OrderCancelled no longer exists", event.order_id)
        return "gone"
    if order.inventory_restored:
        return "already_restored"
    if OrderStatus(order.status) is not OrderStatus.CANCELLED:
        log.warning("restore_inventory: order %s is %s, not Cancelled; nothing restored", order.reference, order.status)
        return "not_cancelled"

    # The lines with their inventory rows in one query, as plain tuples: all the plan reads.
    # Soft-deleted rows included on purpose: a retired variant's stock still belongs to its row.
    rows = session.execute(
        select(OrderLine.variant_id, OrderLine.quantity, InventoryItem.on_hand)
        .outerjoin(InventoryItem, InventoryItem.variant_id == OrderLine.variant_id)
        .where(OrderLine.order_id == order.id).order_by(OrderLine.id)
    ).all()
    lines = [(variant_id, quantity) for variant_id, quantity, _ in rows]
    on_hand = {variant_id: stock for variant_id, _, stock in rows if stock is not None}
    plan = plan_restoration(lines, on_hand)

    if plan.refused:
        # Nothing is saved (no marker, no stock); the warning is the record, and an operator
        # retries after fixing the cause. Not retried automatically: it would refuse again.
        reason = "restore refused by an inventory invariant: " + ", ".join(plan.refusals)
        session.add(RestoreWarning(order_id=order.id, variant_id=None,
                                   quantity=sum(q for _, q in lines), reason=reason, created_at=now))
        log.warning("restore_inventory: order %s (OrderCancelled): %s", order.reference, reason)
        return "refused"

    marked = order.mark_inventory_restored()
    if not marked.ok:
        log.warning("restore_inventory: order %s: %s", order.reference, marked.message)
        return marked.code
    session.flush()  # the marker first: a concurrent delivery loses here, on the order row
    failpoints.hit("restore_inventory.after_marker_flush")

    if plan.increases:
        # One executemany (one round trip on psycopg), still one row at a time in ascending
        # variant id order, like checkout's decrements: no lock-order cycles.
        session.execute(_INCREMENT, [{"variant": variant_id, "quantity": quantity, "now": now}
                                     for variant_id, quantity in sorted(plan.increases.items())])
    for variant_id, quantity in sorted(plan.unmatched.items()):
        # The marker still commits: withholding it would re-apply every matched line next time.
        session.add(RestoreWarning(order_id=order.id, variant_id=variant_id, quantity=quantity,
                                   reason="no inventory row for this variant; quantity not restored",
                                   created_at=now))
        log.warning("restore_inventory: order %s (OrderCancelled): variant %s has no inventory row, "
                    "%d unit(s) not restored", order.reference, variant_id, quantity)
    log.info("restore_inventory: order %s restored %s", order.reference, dict(plan.increases))
    return "restored"


def restore_inventory_now(order_id: int) -> str:
    """Run the compensation directly in its own transaction (operator retry, tests)."""
    from ..domain.deadlines import utcnow
    from ..outbox import uow

    with uow.transaction():
        return restore_inventory(OrderCancelled(order_id, "operator retry"), utcnow())
