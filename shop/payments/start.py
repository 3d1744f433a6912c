"""Starting a payment: a fresh hosted Checkout Session for an order (start_payment), and retiring
an order's session before a customer's cancel. What the provider then says about a session is
applied by `payments.apply`."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from flask import current_app
from sqlalchemy import bindparam, select, update

from ..domain.deadlines import session_expires_at, unpaid_deadline, utcnow
from ..domain.order import ALLOWED, OrderRules, OrderStatus
from ..domain.results import Refused
from ..extensions import db
from ..models import Order, ProviderRefusal
from ..outbox import uow
from ..outbox.writer import write_events
from . import gateway

log = logging.getLogger("shop.payments")
S = OrderStatus


@dataclass
class StartOutcome:
    status: str                 # started | unavailable | refused
    url: str | None = None
    message: str = ""


class PaymentLine(NamedTuple):
    sku: str
    name: str
    quantity: int
    unit_price: int


@dataclass
class PayableOrder(OrderRules):
    """What starting a payment needs to know about an order as of `version`: enough to call the
    provider without holding or re-reading the row. Not mapped: the domain's guarded transition
    runs on it, and start_payment writes the result with a conditional UPDATE."""
    id: int
    reference: str
    access_token: str
    email: str
    currency: str
    lines: tuple[PaymentLine, ...]
    last_change: datetime            # updated_at at `version`: the pay-by time counts from it
    version: int
    status: str = S.PENDING_PAYMENT.value
    payment_attempts: int = 0
    payment_session_id: str | None = None
    payment_session_url: str | None = None
    inventory_restored: bool = False

    @classmethod
    def just_placed(cls, placed) -> PayableOrder:
        """An order place_order has just committed: PendingPayment, version 1, no attempt yet."""
        return cls(placed.order_id, placed.reference, placed.access_token, placed.email, placed.currency,
                   tuple(PaymentLine(l["sku"], l["name"], l["quantity"], l["unit_price"]) for l in placed.lines),
                   placed.placed_at, version=1)

    @classmethod
    def of(cls, order: Order) -> PayableOrder:
        return cls(order.id, order.reference, order.access_token, order.email, order.currency,
                   tuple(PaymentLine(l.sku, l.name, l.quantity, l.unit_price) for l in order.lines),
                   order.updated_at, order.version, order.status, order.payment_attempts,
                   order.payment_session_id, order.payment_session_url, order.inventory_restored)


# The PaymentInitiated write: one UPDATE guarded by the version seen and the transition's allowed
# states (what an ORM flush would check), built once, on the table (nothing in the session to
# synchronise). updated_at takes the column's onupdate, as a flush would.
_orders = Order.__table__
_START_PAYMENT = (
    update(_orders)
    .where(_orders.c.id == bindparam("order"), _orders.c.version == bindparam("seen"),
           _orders.c.status.in_([s.value for s in ALLOWED["start_payment"]]))
    .values(status=bindparam("new_status"), payment_session_id=bindparam("session_id"),
            payment_session_url=bindparam("session_url"), payment_attempts=bindparam("attempts"),
            payment_session_expires_at=bindparam("session_expires", type_=_orders.c.payment_session_expires_at.type),
            payment_processing_at=None, version=_orders.c.version + 1)
)


def start_payment(order_id: int, now: datetime | None = None, *, placed=None) -> StartOutcome:
    """PendingPayment / PaymentFailed -> PaymentInitiated with a fresh hosted Checkout Session.

    The provider call happens outside any transaction (no row lock is held across the
    network); the transition then commits only if nobody moved the order meanwhile: one
    UPDATE guarded by the version seen and the transition's allowed states, the same
    `WHERE version = seen` the ORM would issue, plus the PaymentInitiated event, in one commit.

    `placed` (place_order's result, in the same request) says what the order is at version 1,
    so a checkout does not read back what it has just written."""
    now = now or utcnow()
    session = db.session
    if placed is not None:
        order = PayableOrder.just_placed(placed)
    else:
        row = session.get(Order, order_id)
        if row is None:
            session.rollback()
            return StartOutcome("refused", message="No such order.")
        order = PayableOrder.of(row)
        session.rollback()  # no transaction open across the provider call
    if not order.can("start_payment"):
        return StartOutcome("refused", message=f"This order is {order.status}; it cannot be paid now.")
    cfg = current_app.config
    base = cfg["PUBLIC_BASE_URL"]
    pay_by = unpaid_deadline(order.last_change, cfg["UNPAID_ORDER_EXPIRY_SECONDS"])
    expires = session_expires_at(pay_by, now, cfg["STRIPE_SESSION_MIN_SECONDS"])
    attempt = order.payment_attempts + 1
    seen_version = order.version
    try:
        view = gateway.create_checkout_session(
            order_id=order.id, reference=order.reference, attempt=attempt, lines=order.lines,
            currency=order.currency, email=order.email, expires_at=expires,
            success_url=f"{base}/checkout/return?order={order.reference}&session_id={{CHECKOUT_SESSION_ID}}",
            cancel_url=f"{base}/orders/{order.reference}?token={order.access_token}",
        )
    except gateway.ProviderUnavailable as exc:
        log.warning("order %s: payment provider unreachable, order stays %s: %s", order.reference, order.status, exc)
        return StartOutcome("unavailable", message="We could not reach the payment provider. Your order is saved "
                                                   "and your items are held; please try “Pay now” again in a moment.")
    except gateway.ProviderRefused as exc:
        log.error("order %s: provider refused the checkout session: %s", order.reference, exc)
        _note_refusal(order.id, attempt, exc)
        return StartOutcome("unavailable", message="We could not start the payment: the payment provider turned "
                                                   "the request down. Nothing was charged, and your order and its "
                                                   "items are held until its payment window closes; our team can "
                                                   "see why. Please try “Pay now” again later or contact us.")
    transition = order.start_payment(view.id, view.url)
    if not transition.ok:  # checked above on the same snapshot; kept so the rule has one home
        _expire_quietly(view.id)
        return StartOutcome("refused", message=transition.message)
    try:
        with uow.transaction():
            moved = session.execute(_START_PAYMENT, dict(
                order=order.id, seen=seen_version, new_status=order.status, session_id=order.payment_session_id,
                session_url=order.payment_session_url, attempts=attempt, session_expires=view.expires_at)).rowcount
            if moved != 1:
                raise _Moved(session.execute(select(Order.status, Order.payment_session_id)
                                             .where(Order.id == order.id)).first())
            write_events(session, transition.events)
    except _Moved as lost:
        # A concurrent start of the same attempt (a double click on "Pay now") may have won
        # with the same Idempotency-Key, so the provider handed both the same session: that
        # one is the order's payment page now, not an unused one to expire.
        current = lost.current
        if current is None or current.payment_session_id != view.id:
            _expire_quietly(view.id)
        elif current.status == S.PAYMENT_INITIATED.value:
            return StartOutcome("started", url=view.url)
        status = current.status if current is not None else "gone"
        return StartOutcome("refused", message=f"This order changed meanwhile (now {status}); please reload it.")
    return StartOutcome("started", url=view.url)


class _Moved(Exception):
    """The start's guarded UPDATE missed: the order is no longer at the version seen. Raised
    inside the transaction so it rolls back; carries what the order is now."""

    def __init__(self, current):
        super().__init__("the order moved")
        self.current = current


def _note_refusal(order_id: int, attempt: int, exc: gateway.ProviderRefused) -> None:
    """Keep the provider's reason for the order's console timeline, in its own small commit.
    Bookkeeping only: failing to write it must not change what the customer is told."""
    try:
        with uow.transaction() as session:
            session.add(ProviderRefusal(order_id=order_id, attempt=attempt,
                                        code=(exc.code or None) and str(exc.code)[:100], reason=str(exc)))
    except Exception:  # noqa: BLE001 - logged; the refusal itself is already in the log above
        log.exception("order %s: could not record the provider's refusal", order_id)


def _expire_quietly(session_id: str) -> None:
    try:
        gateway.expire_session(session_id)
    except Exception as exc:
        log.warning("could not expire unused session %s: %s", session_id, exc)


def retire_session_before_cancel(order_id: int, reference: str, sid: str) -> Refused | bool:
    """Read the session's status; paid -> refuse the cancel (the payment stands). Otherwise
    expire it; if the expire fails, read again and refuse if it is now paid. Anything else
    (already expired, gone, provider down) is a warning and the cancellation proceeds.

    Called outside any transaction. True says the session could still take money (an async
    payment settling, or a session that could not be read or expired): the cancel marks the
    order so the sweep watches it (`sweep.watch_cancelled_payments`) and a lost late-payment
    webhook cannot leave the money kept."""
    paid = Refused("payment_already_completed",
                   "This order has already been paid, so it can no longer be cancelled. "
                   "Contact us if you want a refund.")
    try:
        view = gateway.retrieve_session(sid)
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        log.warning("cancel of order %s: could not read session %s (%s); cancelling anyway", reference, sid, exc)
        return True
    if view.payment_status == "paid":
        return paid
    if view.status != "open":
        if view.status == "complete":
            log.warning("cancel of order %s: session %s awaits an async payment; a late success will be refunded",
                        reference, sid)
            return True
        return False
    try:
        gateway.expire_session(sid, cancelling_order=order_id)
        return False
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        try:
            again = gateway.retrieve_session(sid)
        except (gateway.ProviderUnavailable, gateway.ProviderRefused):
            again = None
        if again is not None and again.payment_status == "paid":
            return paid
        log.warning("cancel of order %s: could not expire session %s (%s); cancelling anyway", reference, sid, exc)
        return True
