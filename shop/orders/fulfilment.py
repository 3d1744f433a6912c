"""An order's fulfilment (docs/REFERENCE.md, Console: POST /console/orders/<ref>/ship): an
operator ships a paid order, with the carrier's tracking number when there is one. One guarded
transition, once: a second ship of the same order (a double click, two operators) changes
nothing and says when it shipped. Its OrderShipped event sends the customer's shipment email
through the outbox, like every other email."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..domain.order import OrderStatus, Transition
from ..domain.results import Refused, SubmissionOutcome
from ..outbox import uow
from ..store import order_store

TRACKING_MAX = 100
ALREADY_SHIPPED = "order_already_shipped"
NOTHING_TO_SHIP = "nothing_to_ship"


@dataclass
class Shipment:
    outcome: SubmissionOutcome
    status: OrderStatus | None = None
    shipped_at: datetime | None = None
    tracking: str | None = None
    why: str = ""  # a refusal's code: ALREADY_SHIPPED, NOTHING_TO_SHIP or the transition's own


def ship_order(order_id: int, tracking: str | None, now: datetime) -> Shipment:
    """Ship the paid order `order_id` now, in one transaction (retried once when it loses a race
    to another writer of the order, reading what the winner wrote)."""

    def attempt(n: int) -> Shipment:
        with uow.transaction():
            order = order_store.read(order_id, fresh=n > 0)
            if order is None:
                return Shipment(SubmissionOutcome.MISSING)
            if order.shipped_at is not None:
                return Shipment(SubmissionOutcome.ALREADY, order.status, order.shipped_at, order.tracking)
            if not order.ships and order.status is OrderStatus.PAID:
                return Shipment(SubmissionOutcome.REFUSED, order.status, why=NOTHING_TO_SHIP)
            result = order.ship(tracking, now)
            if isinstance(result, Refused):
                return Shipment(SubmissionOutcome.REFUSED, order.status, why=result.code)
            order_store.save(order, Transition.SHIP, result.events, now=now)
            return Shipment(SubmissionOutcome.DONE, order.status, now, tracking)

    return order_store.retry_on_lost_race(3, attempt)
