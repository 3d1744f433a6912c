"""The expiry pass, one order at a time: an unpaid order (PendingPayment / PaymentFailed) stuck
past the cutoff is cancelled through `order_store.cancel.cancel_unpaid`, the deadline's own expiry.
No provider call: there is nothing to ask about."""

from __future__ import annotations

import logging
from datetime import datetime

from ...domain.deadlines import as_utc
from ...domain.order import UNPAID, OrderStatus
from ...extensions import db
from ...orders.cancel import cancel_unpaid
from ...outbox import uow
from ...store import order_store
from ..cycle import ExpiryOutcome

log = logging.getLogger("shop.sweep")
S = OrderStatus


def expire_stranded_order(order_id: int, cutoffs: dict[OrderStatus, datetime]) -> ExpiryOutcome:
    """Cancel one unpaid order the selection found, in its own transaction, if it still is
    unpaid and past its state's cutoff (`stuck.expiry_cutoffs`) after a fresh load."""
    session = db.session
    order = order_store.read(order_id, fresh=True)
    # updated_at: NOT NULL on the row it was read from.
    if (
        order is None
        or order.status not in UNPAID
        or order.updated_at is None
        or as_utc(order.updated_at) >= cutoffs[order.status]
    ):
        session.rollback()
        log.info("sweep: order %s changed since it was selected; the expiry pass leaves it", order_id)
        return ExpiryOutcome.CHANGED
    with uow.transaction():
        outcome = ExpiryOutcome(cancel_unpaid(order))
    if outcome is ExpiryOutcome.LOST_RACE:  # a webhook or the customer won; the next cycle sees the final state
        log.info(
            "sweep: order %s lost a race to another writer while being expired; left as the other writer set it",
            order_id,
        )
    return outcome
