"""The Order aggregate's rules: states, guarded transitions and the inventory_restored marker.

`OrderRules` is a mixin: the persistence layer's mapped class inherits it and supplies the
attributes (`id`, `status`, `inventory_restored`, `payment_session_id`, ...). Each transition
checks the current state, changes it only when allowed, and returns `Ok(events)` or a
`Refused(code)`; it never raises for an expected refusal. The events are also appended to
`pending_events` so the unit of work can write them to the outbox in the same commit.
"""

from __future__ import annotations

from enum import Enum

from .events import OrderCancelled, OrderPaid, OrderPaymentFailed, PaymentInitiated
from .results import Ok, Refused


class OrderStatus(str, Enum):
    PENDING_PAYMENT = "PendingPayment"
    PAYMENT_INITIATED = "PaymentInitiated"
    PAID = "Paid"
    PAYMENT_FAILED = "PaymentFailed"
    CANCELLED = "Cancelled"

    def __str__(self) -> str:  # so templates and JSON show the documented spelling (docs/REFERENCE.md, Order states)
        return self.value


S = OrderStatus

# docs/REFERENCE.md, Order states, as data: (transition, from-state) pairs that are allowed.
ALLOWED = {
    "start_payment": {S.PENDING_PAYMENT, S.PAYMENT_FAILED},
    "mark_paid": {S.PAYMENT_INITIATED},
    "mark_payment_failed": {S.PAYMENT_INITIATED},
    "cancel": {S.PENDING_PAYMENT, S.PAYMENT_INITIATED, S.PAYMENT_FAILED},
}

# States in which an order still holds stock and waits for money.
UNPAID = (S.PENDING_PAYMENT, S.PAYMENT_FAILED)
LIVE = (S.PENDING_PAYMENT, S.PAYMENT_INITIATED, S.PAYMENT_FAILED)
# The same, as stored in orders.status (for SQL, and for a raw row's status).
LIVE_STATUSES = tuple(s.value for s in LIVE)

# Why an order was cancelled, as its OrderCancelled event says it. The customer reads these
# apart: they asked for one, the other happened to them (the payment window ran out).
CANCELLED_BY_CUSTOMER = "cancelled by customer"
PAYMENT_WINDOW_EXPIRED = "payment window expired"


def cancelled_because(reason: str) -> str:
    """ "customer", "expired" or "other" for an OrderCancelled reason."""
    if reason.startswith(CANCELLED_BY_CUSTOMER):
        return "customer"
    if reason.startswith(PAYMENT_WINDOW_EXPIRED):
        return "expired"
    return "other"


REFUSAL_BY_STATE = {
    S.PAID: "order_already_paid",
    S.CANCELLED: "order_already_cancelled",
}


def _refusal(transition: str, status: OrderStatus) -> Refused:
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

    @property
    def pending_events(self) -> list:
        events = self.__dict__.get("_pending_events")
        if events is None:
            events = []
            self.__dict__["_pending_events"] = events
        return events

    def _state(self) -> OrderStatus:
        return OrderStatus(self.status)

    def _guard(self, transition: str) -> Refused | None:
        state = self._state()
        if state not in ALLOWED[transition]:
            return _refusal(transition, state)
        return None

    def _record(self, *events) -> Ok:
        self.pending_events.extend(events)
        return Ok(tuple(events))

    def can(self, transition: str) -> bool:
        return self._state() in ALLOWED[transition]

    def start_payment(self, session_id: str, session_url: str | None = None):
        refused = self._guard("start_payment")
        if refused:
            return refused
        self.status = S.PAYMENT_INITIATED.value
        self.payment_session_id = session_id
        self.payment_session_url = session_url
        return self._record(PaymentInitiated(self.id, session_id))

    def mark_paid(self, session_id: str, amount: int, currency: str):
        refused = self._guard("mark_paid")
        if refused:
            return refused
        self.status = S.PAID.value
        self.payment_session_id = session_id
        return self._record(OrderPaid(self.id, session_id, amount, currency))

    def mark_payment_failed(self, reason: str):
        refused = self._guard("mark_payment_failed")
        if refused:
            return refused
        self.status = S.PAYMENT_FAILED.value
        return self._record(OrderPaymentFailed(self.id, self.payment_session_id, reason))

    def cancel(self, reason: str):
        refused = self._guard("cancel")
        if refused:
            return refused
        self.status = S.CANCELLED.value
        return self._record(OrderCancelled(self.id, reason))

    def mark_inventory_restored(self):
        """The compensation's idempotency marker; it has its own guard."""
        if self._state() is not S.CANCELLED:
            return Refused(
                "order_not_cancelled", "only a cancelled order's stock can be restored", {"status": self._state().value}
            )
        if self.inventory_restored:
            return Refused("inventory_already_restored", "this order's stock was already restored")
        self.inventory_restored = True
        return Ok(())
