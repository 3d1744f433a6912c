"""An order's fulfilment (docs/REFERENCE.md, Console: POST /console/orders/<ref>/ship): an
operator ships a paid order, with the carrier's tracking number when there is one. One guarded
transition, once: a second ship of the same order (a double click, two operators) changes
nothing and says when it shipped. Its OrderShipped event sends the customer's shipment email
through the outbox, like every other email.

With CAPTURE_MODE=dispatch an Authorized order ships through its capture: the ship asks for it
once (the order's `capture_requested_at`) and schedules the capture command, which takes the
held payment under its own idempotency key (retried with backoff; a refusal is a dead letter for
an operator with the provider's answer), then saves the order Paid and shipped in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..domain.order import OrderStatus, Transition
from ..domain.results import Refused, SubmissionOutcome
from ..extensions import db
from ..models import CommandKind
from ..outbox import schedule_command, uow
from ..outbox.failures import PermanentFailure
from ..payments.holds import CAPTURE_KEY, capture_refused, schedule_void
from ..provider import gateway
from ..store import order_store
from ..store.order_store import LoadedOrder

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
    capturing: bool = False  # an Authorized order: shipped once its capture goes through


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
            if order.status is OrderStatus.AUTHORIZED:
                return _capture_then_ship(order, tracking, now)
            if not order.ships and order.status is OrderStatus.PAID:
                return Shipment(SubmissionOutcome.REFUSED, order.status, why=NOTHING_TO_SHIP)
            result = order.ship(tracking, now)
            if isinstance(result, Refused):
                return Shipment(SubmissionOutcome.REFUSED, order.status, why=result.code)
            order_store.save(order, Transition.SHIP, result.events, now=now)
            return Shipment(SubmissionOutcome.DONE, order.status, now, tracking)

    return order_store.retry_on_lost_race(3, attempt)


def _capture_then_ship(order: LoadedOrder, tracking: str | None, now: datetime) -> Shipment:
    """Ask for the capture of the order's hold, once: a second ask finds it asked. An order that
    moved since it was read (cancelled, or asked by another ship) is read afresh, so a ship never
    says it is capturing the hold of an order cancelled meanwhile."""
    if order.capture_requested_at is not None:
        return Shipment(SubmissionOutcome.ALREADY, order.status, tracking=order.tracking, capturing=True)
    if not order_store.note_capture(order.id, now):
        raise order_store.LostRace(order, Transition.SHIP)
    payload = {"tracking": tracking, "session_id": order.payment_session_id}
    schedule_command(db.session, CommandKind.CAPTURE_PAYMENT, now, order_id=order.id, payload=payload, now=now)
    return Shipment(SubmissionOutcome.DONE, order.status, tracking=tracking, capturing=True)


def execute_capture(order_id: int, payload: dict, now: datetime) -> None:
    """The CAPTURE_PAYMENT command, in the runner's transaction: capture the hold the ship asked
    for (the payload's session; an older command's: the order's), only while it is still the
    payment of the Authorized order (the same key on every retry, so it is taken once), then save
    it Paid and shipped. A hold the order no longer owns (it was paid through another session
    meanwhile) is voided instead, never captured. A capture the provider refuses is a dead letter
    in words for an operator (holds.capture_refused: a hold that ended cancels the order as its
    lapse does; any other refusal withdraws the ask, so the order can be shipped again or
    cancelled). An order whose hold ended while its capture waited (cancelled by the lapse's
    notice) was not shipped: a dead letter says so."""
    order = order_store.read(order_id)
    if order is None:
        return
    if order.status is OrderStatus.CANCELLED and order.capture_requested_at is not None:
        raise PermanentFailure(
            f"order {order.reference} was not shipped: it was cancelled before its capture because its payment "
            "hold ended at the provider. Nothing was taken; its stock comes back and its customer is told."
        )
    asked = payload.get("session_id") or (order.payment_session_id if order.status is OrderStatus.AUTHORIZED else None)
    if asked and order.status is OrderStatus.AUTHORIZED and order.payment_session_id == asked:
        order = _capture(order, asked, now)
    elif asked and asked != order.payment_session_id:
        schedule_void(order.id, asked, None, now)  # not the order's payment any more: given back
    if order.status is OrderStatus.PAID and order.shipped_at is None:
        shipped = order.ship(payload.get("tracking"), now)
        if not isinstance(shipped, Refused):
            order_store.save(order, Transition.SHIP, shipped.events, now=now)


def _capture(order: LoadedOrder, session_id: str, now: datetime) -> LoadedOrder:
    """Take the order's hold through `session_id`, then the order as it is now: Paid by it, or
    (paid through another session while the capture was under way) with the hold's money to give
    back: its void finds it taken and refunds it once. A retried dead letter whose ask was
    withdrawn asks again first (moving the version, as a ship's ask does)."""
    if order.capture_requested_at is None:
        if not order_store.note_capture(order.id, now):
            raise order_store.LostRace(order, Transition.SHIP)
        order = order_store.read(order.id, fresh=True) or order
    intent = gateway.retrieve_session(session_id).payment_intent
    if not intent:
        raise LookupError(f"the provider names no payment for session {session_id} of order {order.reference}")
    try:
        gateway.capture_payment(intent, None, CAPTURE_KEY.format(order=order.id, intent=intent))
    except gateway.ProviderRefused as exc:
        fresh = order_store.read(order.id, fresh=True)
        if fresh is not None and fresh.status is OrderStatus.PAID:
            return fresh  # paid through another session meanwhile, this hold voided: nothing to take
        capture_refused(order, intent, exc, now)
    fresh = order_store.read(order.id, fresh=True)
    assert fresh is not None
    if fresh.status is OrderStatus.PAID:
        if fresh.payment_session_id != session_id:
            schedule_void(fresh.id, session_id, intent, now)
        return fresh
    paid = fresh.mark_paid(session_id, fresh.charged or fresh.total, fresh.currency)
    if isinstance(paid, Refused):
        raise PermanentFailure(f"order {fresh.reference}'s payment was captured but it is {fresh.status}")
    order_store.save(fresh, Transition.MARK_PAID, paid.events, now=now)
    return fresh
