"""The order as the store hands it out for a decision: `LoadedOrder`, an order read at a version,
carrying the domain's rules (`OrderRules`). Not mapped: a transition changes it in memory and
`order_store.save` writes the change with one UPDATE guarded by that version, after which it is
at the new version. Each read fills what its decision needs; the rest keeps its default."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from ..domain.order import OrderRules, OrderStatus
from ..models import Order

S = OrderStatus


class Line(NamedTuple):
    sku: str
    name: str
    quantity: int
    unit_price: int


@dataclass
class LoadedOrder(OrderRules):
    """An order as of `version`, with the domain's guarded transitions. Not mapped: a transition
    changes the snapshot, and `save` writes the change with one guarded UPDATE. Each read fills
    what its decision needs; the rest keeps its default."""

    id: int
    reference: str
    status: OrderStatus
    version: int
    total: int = 0
    currency: str = ""
    email: str = ""
    access_token: str = ""
    payment_session_id: str | None = None
    payment_session_url: str | None = None
    payment_session_expires_at: datetime | None = None
    payment_attempts: int = 0
    inventory_restored: bool = False
    payment_processing_at: datetime | None = None
    late_money_watch_since: datetime | None = None
    last_payment_error: str | None = None
    updated_at: datetime | None = None  # the last state change: the pay-by time counts from it
    lines: tuple[Line, ...] = field(default=())
    ships: bool = False  # physical goods: the payment page collects a shipping address
    shipping_details: dict | None = None  # where to send them, as the provider collected it
    tax: int | None = None  # what the accepted payment charged: written with it
    charged: int | None = None
    cancel_reason: str | None = None  # set by the cancel transition, saved with it
    shipped_at: datetime | None = None  # the fulfilment: set by the ship transition, saved with it
    tracking: str | None = None
    hold_expires_at: datetime | None = None  # CAPTURE_MODE=dispatch: saved with the Authorized transition
    capture_requested_at: datetime | None = None

    @classmethod
    def of(cls, row: Order, *, lines: bool = False) -> LoadedOrder:
        return cls(
            row.id,
            row.reference,
            row.status,
            row.version,
            row.total,
            row.currency,
            row.email,
            row.access_token,
            row.payment_session_id,
            row.payment_session_url,
            row.payment_session_expires_at,
            row.payment_attempts,
            row.inventory_restored,
            row.payment_processing_at,
            row.late_money_watch_since,
            row.last_payment_error,
            row.updated_at,
            tuple(Line(l.sku, l.name, l.quantity, l.unit_price) for l in row.lines) if lines else (),
            bool(row.ships),
            row.shipping_details,
            row.tax,
            row.charged,
            shipped_at=row.shipped_at,
            tracking=row.tracking,
            hold_expires_at=row.hold_expires_at,
            capture_requested_at=row.capture_requested_at,
        )

    @classmethod
    def just_placed(cls, placed) -> LoadedOrder:
        """An order place_order has just committed: PendingPayment, version 1, no attempt yet."""
        return cls(
            placed.order_id,
            placed.reference,
            S.PENDING_PAYMENT,
            1,
            placed.total,
            placed.currency,
            placed.email,
            placed.access_token,
            updated_at=placed.placed_at,
            lines=tuple(Line(l["sku"], l["name"], l["quantity"], l["unit_price"]) for l in placed.lines),
            ships=placed.ships,
        )

    def attempt(self, number: int, session_expires_at: datetime | None) -> None:
        """The payment attempt a start_payment transition opens, for `save` to write with it."""
        self.payment_attempts, self.payment_session_expires_at = number, session_expires_at

    def ships_to(self, details: dict | None) -> None:
        """Where the paid goods go, as the provider collected it: saved with the payment."""
        if details:
            self.shipping_details = details

    def charged_with(self, amount_total: int, tax: int) -> None:
        """What the accepted payment charged (the proof has checked it): saved with the payment."""
        self.charged, self.tax = amount_total, tax

    def held_until(self, capture_before: datetime | None) -> None:
        """When the provider's hold on the payment lapses: saved with the Authorized transition."""
        self.hold_expires_at = capture_before

    def failed_because(self, words: str) -> None:
        """What the customer's order page says about a failed payment, saved with the transition."""
        self.last_payment_error = words
