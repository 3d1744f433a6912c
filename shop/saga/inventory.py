"""Compensation for a cancelled order: give its stock back exactly once.

Sequential redeliveries are stopped by the marker (order_store.inventory_restored), which commits in
the same transaction as the increments it guards. Concurrent deliveries that both read the
marker as unset are stopped by the order's version: the marker is written FIRST, as an UPDATE
... WHERE version = <read>, so the second one fails on the order row before it touches any
stock, rolls back, and its retry finds the marker.

This is the hottest handler (every cancellation, every expired deadline), so it talks to the
tables directly: one SELECT (`store.order_statements.RESTORE_READ`) reads the order's state, its lines and
their stock; the marker is the order store's guarded save, the increments and the warnings are
prebuilt statements with bound parameters. The decisions stay in
the domain: the marker's guard is `OrderRules.mark_inventory_restored` on a snapshot of the
row, and what to give back is `plan_restoration`. Loading and flushing the mapped Order cost
more CPU than everything else the delivery does.
"""

from __future__ import annotations

import logging
from datetime import datetime
from enum import StrEnum

from sqlalchemy import bindparam, insert, update

from .. import failpoints, logs
from ..domain.deadlines import utcnow
from ..domain.events import OrderCancelled
from ..domain.order import OrderStatus, Transition
from ..domain.restoration import plan_restoration
from ..domain.results import Refused
from ..extensions import db
from ..models import InventoryItem, RestoreWarning
from ..outbox import uow
from ..outbox.tables import table_of
from ..store import order_store
from ..store.order_statements import RESTORE_READ
from ..store.order_store import LoadedOrder

log = logging.getLogger("shop.saga")

_inventory, _warnings = table_of(InventoryItem), table_of(RestoreWarning)

_INCREMENT = (
    update(_inventory)
    .where(_inventory.c.variant_id == bindparam("variant"))
    .values(
        on_hand=_inventory.c.on_hand + bindparam("quantity"),
        updated_at=bindparam("now", type_=_inventory.c.updated_at.type),
    )
)
_WARN = insert(_warnings)

_REFUSAL_WORDS = {
    "stock_would_overflow": "variant {variant}'s stock would go over the maximum an inventory row holds",
    "non_positive_quantity": "variant {variant} has an order line with a quantity of zero or less",
}


class RestoreOutcome(StrEnum):
    """What one run of the compensation did."""

    RESTORED = "restored"
    ALREADY_RESTORED = "already_restored"  # the marker was set: nothing given back twice
    NOT_CANCELLED = "not_cancelled"
    REFUSED = "refused"  # an inventory invariant would break: nothing given back, a warning written
    GONE = "gone"  # the order no longer exists
    # The marker's own refusals (OrderRules.mark_inventory_restored), by their codes.
    ORDER_NOT_CANCELLED = "order_not_cancelled"
    INVENTORY_ALREADY_RESTORED = "inventory_already_restored"
    ERROR = "error"  # an operator's retry that raised (saga.warnings); never the handler's own


def _lines_left(rows) -> list[tuple[int, int]]:
    """(variant, units) of each line less what refunds put back; a line all back is left out."""
    return [(variant_id, quantity) for *_, variant_id, quantity, _ in rows if variant_id is not None and quantity != 0]


def _refusal_words(code: str) -> str:
    """`stock_would_overflow:variant=2` -> words an operator can act on (the code stays in them)."""
    name, _, rest = code.partition(":")
    variant = rest.partition("=")[2] or "?"
    return _REFUSAL_WORDS.get(name, name).format(variant=variant) + f" ({code})"


def restore_inventory(event: OrderCancelled, now: datetime) -> RestoreOutcome:
    session = db.session
    rows = session.execute(RESTORE_READ, {"order_id": event.order_id}).all()
    if not rows:
        log.warning("restore_inventory: order %s from OrderCancelled no longer exists", event.order_id)
        return RestoreOutcome.GONE
    reference, status, restored, version = rows[0][:4]
    logs.learn(order_ref=reference)
    order = LoadedOrder(
        event.order_id, reference, status, version, inventory_restored=bool(restored), cancel_reason=event.reason
    )
    if order.inventory_restored:
        return RestoreOutcome.ALREADY_RESTORED
    if order.status is not OrderStatus.CANCELLED:
        log.warning("restore_inventory: order %s is %s, not Cancelled; nothing restored", reference, status)
        return RestoreOutcome.NOT_CANCELLED
    lines = _lines_left(rows)
    on_hand = {variant_id: stock for *_, variant_id, _, stock in rows if variant_id is not None and stock is not None}
    plan = plan_restoration(lines, on_hand)
    if plan.refused:
        _refuse(order, plan, lines, now)
        return RestoreOutcome.REFUSED
    marked = order.mark_inventory_restored()
    if isinstance(marked, Refused):
        log.warning("restore_inventory: order %s: %s", reference, marked.message)
        return RestoreOutcome(marked.code)
    # The marker first: a concurrent delivery that read the same version loses here (LostRace),
    # on the order row, before it touches any stock; its retry finds the marker.
    order_store.save(order, Transition.MARK_INVENTORY_RESTORED, now=now)
    failpoints.hit("restore_inventory.after_marker_flush")
    _give_back(order, plan, now)
    log.info("restore_inventory: order %s restored %s", reference, dict(plan.increases))
    return RestoreOutcome.RESTORED


def _refuse(order: LoadedOrder, plan, lines, now: datetime) -> None:
    """Nothing is saved (no marker, no stock); the warning is the record, and an operator retries
    after fixing the cause. Not retried automatically: it would refuse again."""
    reason = (
        "nothing given back for this order, because "
        + "; ".join(_refusal_words(r) for r in plan.refusals)
        + ". Fix the stock by hand and resolve, or fix the cause and retry the restore."
    )
    db.session.execute(
        _WARN,
        dict(order_id=order.id, variant_id=None, quantity=sum(q for _, q in lines), reason=reason, created_at=now),
    )
    log.warning("restore_inventory: order %s (OrderCancelled): %s", order.reference, reason)


def _give_back(order: LoadedOrder, plan, now: datetime) -> None:
    session = db.session
    if plan.increases:
        # One executemany (one round trip on psycopg), still one row at a time in ascending
        # variant id order, like checkout's decrements: no lock-order cycles.
        session.execute(
            _INCREMENT,
            [
                {"variant": variant_id, "quantity": quantity, "now": now}
                for variant_id, quantity in sorted(plan.increases.items())
            ],
        )
    for variant_id, quantity in sorted(plan.unmatched.items()):
        # The marker still commits: withholding it would re-apply every matched line next time.
        session.execute(
            _WARN,
            dict(
                order_id=order.id,
                variant_id=variant_id,
                quantity=quantity,
                reason="no inventory row for this variant; quantity not restored",
                created_at=now,
            ),
        )
        log.warning(
            "restore_inventory: order %s (OrderCancelled): variant %s has no inventory row, %d unit(s) not restored",
            order.reference,
            variant_id,
            quantity,
        )


def restore_inventory_now(order_id: int) -> RestoreOutcome:
    """Run the compensation directly in its own transaction (operator retry, tests)."""
    with uow.transaction():
        return restore_inventory(OrderCancelled(order_id, "operator retry"), utcnow())
