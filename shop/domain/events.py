"""Domain events recorded by the order's transitions. Handlers receive them from the outbox."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import StrEnum


class EventName(StrEnum):
    """An event's name as the outbox stores it (`outbox_events.name`): its class's name."""

    ORDER_PLACED = "OrderPlaced"
    PAYMENT_INITIATED = "PaymentInitiated"
    ORDER_PAID = "OrderPaid"
    ORDER_PAYMENT_FAILED = "OrderPaymentFailed"
    ORDER_CANCELLED = "OrderCancelled"
    ORDER_SHIPPED = "OrderShipped"
    ORDER_AUTHORIZED = "OrderAuthorized"


@dataclass(frozen=True)
class DomainEvent:
    order_id: int

    @property
    def name(self) -> EventName:
        return EventName(type(self).__name__)

    def payload(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class OrderPlaced(DomainEvent):
    reference: str
    total: int
    currency: str


@dataclass(frozen=True)
class PaymentInitiated(DomainEvent):
    session_id: str


@dataclass(frozen=True)
class PaymentTaken(DomainEvent):
    """The provider has the customer's money for the order: its session, what it charged, in what."""

    session_id: str
    amount: int
    currency: str


@dataclass(frozen=True)
class OrderPaid(PaymentTaken):
    """The money is taken."""


@dataclass(frozen=True)
class OrderAuthorized(PaymentTaken):
    """The money is held, and taken when the order ships (CAPTURE_MODE=dispatch)."""


@dataclass(frozen=True)
class OrderPaymentFailed(DomainEvent):
    session_id: str | None
    reason: str


@dataclass(frozen=True)
class OrderCancelled(DomainEvent):
    reason: str


@dataclass(frozen=True)
class OrderShipped(DomainEvent):
    tracking: str | None


EVENT_TYPES: dict[EventName, type[DomainEvent]] = {
    EventName(cls.__name__): cls
    for cls in (
        OrderPlaced,
        PaymentInitiated,
        OrderPaid,
        OrderPaymentFailed,
        OrderCancelled,
        OrderShipped,
        OrderAuthorized,
    )
}


def event_from_payload(name: str, payload: dict) -> DomainEvent:
    cls = EVENT_TYPES[EventName(name)]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in payload.items() if k in names})
