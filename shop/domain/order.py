"""The Order aggregate's rules: states, guarded transitions and the inventory_restored marker.

`OrderRules` is a mixin for the order the store hands out for a decision (the store's loaded
order, a plain dataclass); the mapped row does not carry the rules, so nothing but the store can
change an order. Each transition checks the current state, changes it only when allowed, and
returns `Ok(events)` or a `Refused(code)`; it never raises for an expected refusal. `Ok.events`
is the one way a transition's events travel: the caller hands them to the store's save, which
writes them to the outbox with the transition.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from .events import (
    OrderAuthorized,
    OrderCancelled,
    OrderPaid,
    OrderPaymentFailed,
    OrderShipped,
    PaymentInitiated,
    PaymentTaken,
)
from .results import Ok, Refused


class OrderStatus(StrEnum):
    """An order's state, with the documented spelling as its value (docs/REFERENCE.md, Order
    states). A StrEnum: it is written to the column, JSON and templates as that spelling."""

    PENDING_PAYMENT = "PendingPayment"
    PAYMENT_INITIATED = "PaymentInitiated"
    PAID = "Paid"
    # CAPTURE_MODE=dispatch: the provider holds the customer's money until the order ships.
    AUTHORIZED = "Authorized"
    PAYMENT_FAILED = "PaymentFailed"
    CANCELLED = "Cancelled"


S = OrderStatus


class Transition(StrEnum):
    """What the store can save: the aggregate's transitions, plus `adopt_and_pay` and
    `adopt_and_authorize` (money that is real, or held, for an order that had not started its
    payment: start and pay, or authorize, in one write)."""

    START_PAYMENT = "start_payment"
    MARK_PAID = "mark_paid"
    MARK_AUTHORIZED = "mark_authorized"
    ADOPT_AND_PAY = "adopt_and_pay"
    # The same for money the provider holds (CAPTURE_MODE=dispatch): start and authorize in one write.
    ADOPT_AND_AUTHORIZE = "adopt_and_authorize"
    MARK_PAYMENT_FAILED = "mark_payment_failed"
    CANCEL = "cancel"
    MARK_INVENTORY_RESTORED = "mark_inventory_restored"
    # A paid order's stock given back with an operator's refund: the same marker as the
    # compensation's, so the stock comes back once whichever path gives it.
    RESTOCK_PAID = "restock_paid"
    # An operator shipped a paid order: its fulfilment, not a payment state (once).
    SHIP = "ship"


T = Transition

# docs/REFERENCE.md, Order states, as data: the states each transition may leave from.
ALLOWED = {
    T.START_PAYMENT: frozenset({S.PENDING_PAYMENT, S.PAYMENT_FAILED}),
    # From Authorized: the hold captured when the order ships.
    T.MARK_PAID: frozenset({S.PAYMENT_INITIATED, S.AUTHORIZED}),
    T.MARK_AUTHORIZED: frozenset({S.PAYMENT_INITIATED}),
    T.ADOPT_AND_PAY: frozenset({S.PENDING_PAYMENT, S.PAYMENT_FAILED}),
    T.ADOPT_AND_AUTHORIZE: frozenset({S.PENDING_PAYMENT, S.PAYMENT_FAILED}),
    T.MARK_PAYMENT_FAILED: frozenset({S.PAYMENT_INITIATED}),
    # An Authorized order's hold is voided with its cancel, never refunded (payments.holds).
    T.CANCEL: frozenset({S.PENDING_PAYMENT, S.PAYMENT_INITIATED, S.PAYMENT_FAILED, S.AUTHORIZED}),
    T.MARK_INVENTORY_RESTORED: frozenset({S.CANCELLED}),
    T.RESTOCK_PAID: frozenset({S.PAID}),
    T.SHIP: frozenset({S.PAID}),
}

# States in which an order still holds stock and waits for money; LIVE adds the one in which
# the provider holds the customer's payment page. FINAL: nothing changes an order's state again.
UNPAID = (S.PENDING_PAYMENT, S.PAYMENT_FAILED)
LIVE = (S.PENDING_PAYMENT, S.PAYMENT_INITIATED, S.PAYMENT_FAILED)
FINAL = (S.PAID, S.CANCELLED)
# The live states as stored in orders.status (for SQL, and for a raw row's status).
LIVE_STATUSES = tuple(s.value for s in LIVE)

# Why an order was cancelled, as its OrderCancelled event says it. The customer reads these
# apart: they asked for one, the other happened to them (the payment window ran out).
CANCELLED_BY_CUSTOMER = "cancelled by customer"
PAYMENT_WINDOW_EXPIRED = "payment window expired"
# A newer checkout for the same email address, from another browser, took this order's place
# under UNPAID_ORDERS_PER_CLIENT (orders.release). No email: the address gets the newer order's.
RELEASED_FOR_NEWER = "released for a newer order of the same email address"
# CAPTURE_MODE=dispatch: an Authorized order not shipped by AUTHORIZATION_MARGIN_SECONDS before its
# hold lapses is cancelled and its hold voided (payments.holds.end_hold). The customer is told.
HOLD_LAPSING = "payment hold about to lapse before the order shipped"


class CancelledBy(StrEnum):
    CUSTOMER = "customer"
    EXPIRED = "expired"
    HOLD = "hold"
    OTHER = "other"


def cancelled_because(reason: str) -> CancelledBy:
    """Who or what cancelled an order, from its OrderCancelled reason."""
    if reason.startswith(CANCELLED_BY_CUSTOMER):
        return CancelledBy.CUSTOMER
    if reason.startswith(PAYMENT_WINDOW_EXPIRED):
        return CancelledBy.EXPIRED
    if reason.startswith(HOLD_LAPSING):
        return CancelledBy.HOLD
    return CancelledBy.OTHER


REFUSAL_BY_STATE = {
    S.PAID: "order_already_paid",
    S.CANCELLED: "order_already_cancelled",
}


def _refusal(transition: Transition, status: OrderStatus) -> Refused:
    code = REFUSAL_BY_STATE.get(status, "invalid_transition")
    return Refused(
        code,
        f"cannot {transition.replace('_', ' ')} an order that is {status.value}",
        {"transition": transition, "status": status.value},
    )


class OrderRules:
    """Guarded transitions. Subclasses provide the state attributes."""

    id: int
    status: OrderStatus
    inventory_restored: bool
    payment_session_id: str | None
    cancel_reason: str | None
    shipped_at: datetime | None
    tracking: str | None

    def _guard(self, transition: Transition) -> Refused | None:
        if self.status not in ALLOWED[transition]:
            return _refusal(transition, self.status)
        return None

    def _record(self, *events) -> Ok:
        return Ok(events)

    def can(self, transition: Transition) -> bool:
        return self.status in ALLOWED[transition]

    def start_payment(self, session_id: str, session_url: str | None = None):
        refused = self._guard(T.START_PAYMENT)
        if refused:
            return refused
        self.status = S.PAYMENT_INITIATED
        self.payment_session_id = session_id
        self.payment_session_url = session_url
        return self._record(PaymentInitiated(self.id, session_id))

    def mark_paid(self, session_id: str, amount: int, currency: str):
        return self._take_payment(T.MARK_PAID, S.PAID, OrderPaid(self.id, session_id, amount, currency))

    def mark_authorized(self, session_id: str, amount: int, currency: str):
        """The provider holds the payment (CAPTURE_MODE=dispatch): captured when the order ships."""
        return self._take_payment(
            T.MARK_AUTHORIZED, S.AUTHORIZED, OrderAuthorized(self.id, session_id, amount, currency)
        )

    def _take_payment(self, transition: Transition, status: OrderStatus, event: PaymentTaken):
        """The provider has the money (`event`): the order is in `status`, paid by the event's session."""
        refused = self._guard(transition)
        if refused:
            return refused
        self.status = status
        self.payment_session_id = event.session_id
        return self._record(event)

    def mark_payment_failed(self, reason: str):
        refused = self._guard(T.MARK_PAYMENT_FAILED)
        if refused:
            return refused
        self.status = S.PAYMENT_FAILED
        return self._record(OrderPaymentFailed(self.id, self.payment_session_id, reason))

    def cancel(self, reason: str):
        refused = self._guard(T.CANCEL)
        if refused:
            return refused
        self.status = S.CANCELLED
        self.cancel_reason = reason
        return self._record(OrderCancelled(self.id, reason))

    def ship(self, tracking: str | None, at: datetime):
        """The order's goods left (`tracking`: the carrier's number, if any): once, and only for
        a paid order; a second ship is refused, so a second click changes nothing."""
        refused = self._guard(T.SHIP)
        if refused:
            return refused
        if self.shipped_at is not None:
            return Refused("order_already_shipped", "this order was already shipped", {"status": self.status.value})
        self.shipped_at = at
        self.tracking = tracking
        return self._record(OrderShipped(self.id, tracking))

    def mark_inventory_restored(self):
        """The compensation's idempotency marker; it has its own guard."""
        return self._set_restored(S.CANCELLED, "order_not_cancelled", "only a cancelled order's stock can be restored")

    def restock_paid(self):
        """The marker again, for a paid order an operator refunds with its stock given back; it
        is the compensation's own, so a later restore of the order finds it set."""
        return self._set_restored(S.PAID, "order_not_paid", "only a paid order is restocked with a refund")

    def _set_restored(self, status: S, code: str, words: str):
        """Sets the stock-restored marker once, for an order in `status` (else refused as `code`,
        `words`)."""
        if self.status is not status:
            return Refused(code, words, {"status": self.status.value})
        if self.inventory_restored:
            return Refused("inventory_already_restored", "this order's stock was already restored")
        self.inventory_restored = True
        return Ok(())
