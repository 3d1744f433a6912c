"""How an order is shown: `OrderView`, the one read shape of an order for its pages and JSON (the
storefront's order page, its cancel page, the customer's list, the console's order), built from
the order's row by `OrderView.of`, and the JSON shape of docs/REFERENCE.md, Storefront."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from ..domain.order import UNPAID, CancelledBy, OrderStatus, cancelled_because
from ..domain.refunds import NOT_RETURNED, PENDING, SUCCEEDED, PaidAndRefunded, charged_for, paid_and_refunded
from ..domain.timestamps import iso
from ..models import Order
from ..orders.deadline import pay_by


class PaymentStatus(StrEnum):
    """`payment.status` in the order's JSON (docs/REFERENCE.md, Order states)."""

    QUEUED = "queued"
    NOT_STARTED = "not_started"
    OPEN = "open"
    PROCESSING = "processing"  # checkout finished; the provider settles the payment later
    DECLINED = "declined"  # a card was refused on the open payment page, which takes another
    PAID = "paid"
    AUTHORIZED = "authorized"  # CAPTURE_MODE=dispatch: held, taken when the order ships
    FAILED = "failed"
    CANCELLED = "cancelled"


P = PaymentStatus
PAYMENT_STATUS = {
    OrderStatus.PENDING_PAYMENT: P.NOT_STARTED,
    OrderStatus.PAYMENT_INITIATED: P.OPEN,
    OrderStatus.PAID: P.PAID,
    OrderStatus.AUTHORIZED: P.AUTHORIZED,
    OrderStatus.PAYMENT_FAILED: P.FAILED,
    OrderStatus.CANCELLED: P.CANCELLED,
}

# The badge a customer sees for an order, in the words of the page's own text: the state alone
# does not say enough ("At the payment page" for a payment the provider is settling, "Cancelled"
# for an order whose window ran out), so the payment and the cancellation's reason count too.
BADGES = {
    "awaiting": "Awaiting payment",
    "in-line": "In line for payment",
    "at-payment-page": "At the payment page",
    "declined": "Card declined",
    "processing": "Payment processing",
    "failed": "Payment failed",
    "paid": "Paid",
    "authorized": "Payment authorized",
    "shipping": "Being shipped",
    "partially-refunded": "Partially refunded",
    "paid-refunded": "Refunded",
    "expired": "Expired",
    "cancelled": "Cancelled",
    "refund-pending": "Cancelled, refund on its way",
    "refund-failed": "Cancelled, refund did not go through",
    "refunded": "Cancelled, refunded",
}

PAID_BADGES = {
    PaidAndRefunded.PAID: "paid",
    PaidAndRefunded.PARTIALLY_REFUNDED: "partially-refunded",
    PaidAndRefunded.REFUNDED: "paid-refunded",
}


@dataclass(frozen=True, slots=True)
class LineView:
    variant_id: int
    sku: str
    name: str
    quantity: int
    unit_price: int


@dataclass(frozen=True, slots=True)
class RefundView:
    """A refund as the customer's page states it (the provider's last word on it, and whether an
    operator settled it outside the provider)."""

    id: int
    amount: int
    currency: str
    status: str
    attempts: int
    failure_reason: str | None
    updated_at: datetime
    settled_at: datetime | None
    request_key: str | None  # an operator's refund of a paid order


@dataclass(frozen=True, slots=True)
class MoneyView:
    """What the order's money came to, in minor units: the one summary the customer's page, the
    order's JSON and the console's money summary read. `charged`: what the payment charged, tax
    included (the total before a payment); `refunded`: refunds that succeeded at the provider;
    `settled`: refunds an operator settled outside the provider (the provider calls them failed);
    `taken`: whether money was taken at all (the order paid, or any refund: a hold's charge,
    recorded while Authorized and kept when its cancel voids it, took nothing);
    `tax`: the tax in the payment (None without tax)."""

    charged: int
    refunded: int
    settled: int
    taken: bool
    is_paid: bool
    tax: int | None

    @property
    def net(self) -> int:
        """What the customer paid less what went back through the provider (the customer's page)."""
        return self.charged - self.refunded

    @property
    def money_back(self) -> PaidAndRefunded | None:
        """How much of a paid order's payment went back (None unless Paid)."""
        return paid_and_refunded(self.charged, self.refunded) if self.is_paid else None

    # The console's summary: what was paid (nothing until money was taken), returned to the
    # customer however it went back, and what the shop keeps.
    @property
    def paid(self) -> int:
        return self.charged if self.taken else 0

    @property
    def returned(self) -> int:
        return self.refunded + self.settled

    @property
    def kept(self) -> int:
        return self.paid - self.returned


@dataclass(frozen=True, slots=True)
class PaymentView:
    session_id: str | None
    url: str | None
    status: PaymentStatus


@dataclass(frozen=True, slots=True)
class OrderView:
    """One order as its pages and JSON show it, read from its row once: the facts, not the row, so
    nothing drawing a page reaches back to the database for more."""

    id: int
    reference: str
    access_token: str
    email: str
    status: OrderStatus
    version: int
    total: int
    currency: str
    inventory_restored: bool
    lines: tuple[LineView, ...]
    refunds: tuple[RefundView, ...]
    payment: PaymentView | None
    in_line: bool  # waiting in line for its payment page (the provider's budget was spent)
    payment_queued_at: datetime | None  # since when: its place in that line
    created_at: datetime
    updated_at: datetime
    pay_by: datetime | None
    last_payment_error: str | None  # the words saved with the last failed or declined payment
    ships: bool
    shipping: dict | None
    cancelled_because: CancelledBy | None  # None unless Cancelled
    cancelled_at: datetime | None
    payment_attempts: int
    payment_session_id: str | None
    payment_session_url: str | None
    provider_next_check_at: datetime | None
    late_money_watch_since: datetime | None
    # What the accepted payment charged: its tax (TAX_MODE=stripe) and the total with it; None until paid.
    tax: int | None = None
    charged: int | None = None
    shipped_at: datetime | None = None  # the fulfilment: None while unfulfilled
    tracking: str | None = None
    # CAPTURE_MODE=dispatch: a ship is capturing the Authorized order's hold; it can no longer be cancelled.
    being_shipped: bool = False

    @classmethod
    def of(cls, row: Order) -> OrderView:
        status = OrderStatus(row.status)
        in_line = row.payment_queued_at is not None and status in UNPAID
        cancelled = status is OrderStatus.CANCELLED
        return cls(
            id=row.id,
            reference=row.reference,
            access_token=row.access_token,
            email=row.email,
            status=status,
            version=row.version,
            total=row.total,
            currency=row.currency,
            inventory_restored=bool(row.inventory_restored),
            lines=tuple(LineView(l.variant_id, l.sku, l.name, l.quantity, l.unit_price) for l in row.lines),
            refunds=tuple(
                RefundView(
                    r.id,
                    r.amount,
                    r.currency,
                    r.status,
                    r.attempts,
                    r.failure_reason,
                    r.updated_at,
                    r.settled_at,
                    r.request_key,
                )
                for r in row.refunds
            ),  # fmt: skip
            payment=_payment(row, status, in_line),
            in_line=in_line,
            payment_queued_at=row.payment_queued_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            pay_by=pay_by(row),
            last_payment_error=row.last_payment_error,
            ships=bool(row.ships),
            shipping=row.shipping_details,
            cancelled_because=cancelled_because(row.cancel_reason or "") if cancelled else None,
            cancelled_at=row.cancelled_at if cancelled else None,
            payment_attempts=row.payment_attempts,
            payment_session_id=row.payment_session_id,
            payment_session_url=row.payment_session_url,
            provider_next_check_at=row.provider_next_check_at,
            late_money_watch_since=row.late_money_watch_since,
            tax=row.tax,
            charged=row.charged,
            shipped_at=row.shipped_at,
            tracking=row.tracking,
            being_shipped=status is OrderStatus.AUTHORIZED and row.capture_requested_at is not None,
        )

    @property
    def payment_status(self) -> PaymentStatus | None:
        return self.payment.status if self.payment else None

    @property
    def payment_error(self) -> str | None:
        """Why the last payment did not go through, in the customer's words, while that is news: a
        card declined on the open payment page, or a failed payment (PaymentFailed)."""
        if self.status is OrderStatus.PAYMENT_FAILED or self.payment_status is P.DECLINED:
            return self.last_payment_error or "Your payment did not go through."
        return None

    @property
    def money(self) -> MoneyView:
        """The order's money summary. Without a recorded charge (an order paid before the shop
        wrote one, or late money on a cancelled order) the payment charged the total."""
        is_paid = self.status is OrderStatus.PAID
        return MoneyView(
            charged=charged_for(self.total, self.charged),
            refunded=sum(r.amount for r in self.refunds if r.status == SUCCEEDED),
            settled=sum(r.amount for r in self.refunds if r.settled_at is not None and r.status != SUCCEEDED),
            taken=is_paid or bool(self.refunds),
            is_paid=is_paid,
            tax=self.tax or None,
        )

    @property
    def settled_refunds(self) -> list[int]:
        """Refunds the shop settled with the customer outside the payment provider (an operator's
        record): the provider still calls them failed."""
        return [r.id for r in self.refunds if r.settled_at is not None]

    def json(self) -> dict:
        """The order's JSON (docs/REFERENCE.md, Storefront, `GET /orders/<ref>`)."""
        payment = self.payment
        return {
            "reference": self.reference,
            "status": self.status,
            "version": self.version,
            "total": self.total,
            "currency": self.currency,
            "inventory_restored": self.inventory_restored,
            "lines": [
                {
                    "variant_id": l.variant_id,
                    "sku": l.sku,
                    "name": l.name,
                    "quantity": l.quantity,
                    "unit_price": l.unit_price,
                }
                for l in self.lines
            ],  # fmt: skip
            "payment": None
            if payment is None
            else {"session_id": payment.session_id, "url": payment.url, "status": payment.status},
            "refunds": [{"id": r.id, "amount": r.amount, "status": r.status} for r in self.refunds],
            "refunded": self.money.refunded,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "pay_by": iso(self.pay_by),
            "last_payment_error": self.payment_error,
            "ships": self.ships,
            "shipping": self.shipping,
            "tax": self.tax,
            "charged": self.charged,
            "fulfilment": {
                "status": "shipped" if self.shipped_at else "unfulfilled",
                "shipped_at": iso(self.shipped_at),
                "tracking": self.tracking,
            },
        }

    def shown_json(self) -> dict:
        """The customer's order page's JSON: the order's, with why and when for a cancelled order
        and the refunds settled outside the provider (the page's words and badge)."""
        data = self.json()
        settled = self.settled_refunds
        if settled:
            data["refunds_settled"] = settled
        if self.cancelled_because is not None:
            data["cancelled_because"], data["cancelled_at"] = self.cancelled_because, iso(self.cancelled_at)
        return data

    @property
    def badge(self) -> tuple[str, str]:
        """(key, words): the badge of the order's page and of the customer's list. The key is also
        the badge's CSS class."""
        key = _badge_key(self)
        return key, BADGES[key]

    @property
    def keeps_changing(self) -> bool:
        """Whether something other than the customer can still change what the order page says: a
        payment to make or settling, the deadline, the stock coming back, a refund on its way."""
        status = self.status
        if status in UNPAID or status is OrderStatus.PAYMENT_INITIATED or self.being_shipped:
            return True
        if status is OrderStatus.CANCELLED:
            pending = any(r.status == PENDING for r in self.refunds)
            return not self.inventory_restored or self.payment_status is P.PROCESSING or pending
        return False

    @property
    def watch_state(self) -> str:
        """What the order page's script compares to notice a change worth showing (static/shop.js
        computes the same string from the JSON): the state, the payment's, the stock's return and
        the refunds."""
        return "/".join(
            [
                self.status,
                self.payment_status or "-",
                "restored" if self.inventory_restored else "-",
                ",".join(r.status for r in self.refunds),
            ]
        )


def _payment(row: Order, status: OrderStatus, in_line: bool) -> PaymentView | None:
    if in_line:
        return PaymentView(None, None, P.QUEUED)
    if not row.payment_session_id:
        return None
    shown = PAYMENT_STATUS[status]
    if shown is P.OPEN and row.payment_processing_at is not None:
        shown = P.PROCESSING
    elif shown is P.OPEN and row.payment_declined_at is not None:
        shown = P.DECLINED
    return PaymentView(row.payment_session_id, row.payment_session_url, shown)


def _badge_key(order: OrderView) -> str:
    status, payment = order.status, order.payment_status
    if payment is P.QUEUED:
        return "in-line"
    if status is OrderStatus.PENDING_PAYMENT:
        return "awaiting"
    if status is OrderStatus.PAYMENT_INITIATED:
        return {P.PROCESSING: "processing", P.DECLINED: "declined"}.get(payment or P.OPEN, "at-payment-page")
    if status in (OrderStatus.PAYMENT_FAILED, OrderStatus.AUTHORIZED):
        return "failed" if status is OrderStatus.PAYMENT_FAILED else "shipping" if order.being_shipped else "authorized"
    if status is OrderStatus.PAID:
        return PAID_BADGES[order.money.money_back or PaidAndRefunded.PAID]
    # A refund an operator settled outside the shop is done, whatever the provider said.
    settled = set(order.settled_refunds)
    refunds = [r.status for r in order.refunds if r.id not in settled]
    if any(refund in NOT_RETURNED for refund in refunds):
        return "refund-failed"
    if PENDING in refunds:
        return "refund-pending"
    if SUCCEEDED in refunds or settled:
        return "refunded"
    return "expired" if order.cancelled_because is CancelledBy.EXPIRED else "cancelled"


def summary_json(order) -> dict:
    """An order as the customer's list of orders gives it: of an OrderView, or of a row of those
    columns (order_store.summaries_of_browser)."""
    keys = ("reference", "status", "total", "currency")
    return {**{key: getattr(order, key) for key in keys}, "created_at": iso(order.created_at)}
