from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    event,
    false,
    func,
    text,
)
from sqlalchemy.orm import Mapped, Session, mapped_column, relationship

from ..domain.order import OrderStatus
from ..extensions import Model
from .types import OrderStatusText, UTCDateTime, now_utc

# The console's to-ship list (GET /console/shipping): paid or authorized orders with goods not yet
# shipped nor being captured. One text for the partial index's predicate and for the query, so that
# both databases see the very terms the index was built on (each proves "implied" only by matching).
TO_SHIP = (
    "ships = true AND shipped_at IS NULL AND capture_requested_at IS NULL "
    f"AND status IN ('{OrderStatus.PAID.value}', '{OrderStatus.AUTHORIZED.value}')"
)


class ReadOnlyOrder(RuntimeError):
    """Something tried to write an order through the mapped class instead of the order store."""


class Order(Model):
    """The order aggregate's row, as data to read: it has no transitions, and a session refuses to
    flush a new, changed or deleted Order (see `_orders_are_written_by_the_store`). Every write goes
    through the order store (shop/store/order_store.py), whose UPDATEs carry `WHERE version = <the
    version read>`: `version` is the optimistic-concurrency token, so two writers that read the
    same state cannot both commit."""

    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(20), unique=True)
    access_token: Mapped[str] = mapped_column(String(64))
    browser_id: Mapped[str] = mapped_column(String(64), index=True)
    email: Mapped[str] = mapped_column(String(254))
    # The address the checkout came from (request.remote_addr): UNPAID_ORDERS_PER_ADDRESS counts
    # live orders by it, and customer emails are capped by it. None for orders placed otherwise.
    client_address: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    status: Mapped[OrderStatus] = mapped_column(OrderStatusText)
    total: Mapped[int] = mapped_column(Integer)
    currency: Mapped[str] = mapped_column(String(3))
    inventory_restored: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    payment_session_id: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)
    payment_session_url: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    payment_session_expires_at = mapped_column(UTCDateTime, nullable=True)
    payment_attempts: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    last_payment_error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    # A card the customer tried on the payment page was declined, when: the session stays open
    # (they may try another card there), so the order stays PaymentInitiated and its page says
    # so with `last_payment_error`'s words. Bookkeeping; a new payment session clears it.
    payment_declined_at = mapped_column(UTCDateTime, nullable=True)
    # The order holds physical goods (a product that `ships`), decided from the catalog at
    # checkout: its payment page asks for a shipping address.
    ships: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=false())
    # Where to send it, as the provider collected it with the payment: {"name", "address":
    # {"line1", "line2", "city", "postal_code", "state", "country"}}. Written with the payment.
    shipping_details = mapped_column(JSON(none_as_null=True), nullable=True)
    # What the accepted payment charged, in minor units, written with it: the tax Stripe Tax added
    # (0 without TAX_MODE=stripe) and the amount charged (the total plus that tax). None until paid.
    # Every refund of the payment refunds from `charged`, never from `total` (the goods).
    tax: Mapped[int | None] = mapped_column(Integer, nullable=True)
    charged: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The sweep's own bookkeeping, not a state change (no version bump): when asking the provider
    # again is worth it for an order whose answer cannot change soon (a refused payment proof
    # waits for an operator, an async payment for the bank). Without it such orders, being the
    # oldest, would fill every cycle's batch and starve the rest.
    provider_next_check_at = mapped_column(UTCDateTime, nullable=True)
    # A live order whose customer finished checkout with a payment that settles later (a bank
    # debit), since when: the order page says "being processed" instead of offering the payment
    # page. Bookkeeping: no version bump, no new updated_at. Cleared by every transition.
    payment_processing_at = mapped_column(UTCDateTime, nullable=True)
    # A cancelled order whose session could still take money (an async payment was settling, or
    # the cancel could not retire the session), since when: the sweep watches it, so a lost
    # late-payment webhook cannot leave money unrefunded, until nothing more can come and every
    # refund of it has succeeded. Bookkeeping, like the one above. Indexed: few rows carry it,
    # and the sweep looks for exactly those.
    late_money_watch_since = mapped_column(UTCDateTime, nullable=True, index=True)
    # In line for the payment page: the provider's budget for new sessions was spent (or this
    # process had no free provider slot) when the customer checked out or chose "Pay now", so the
    # payment queue creates the session as soon as the budget allows, in this order (then id).
    # Bookkeeping, like the two above; every transition out of the unpaid states clears it, so
    # only orders waiting in line carry it (the partial index holds just those).
    payment_queued_at = mapped_column(UTCDateTime, nullable=True)
    # Why and when the order was cancelled (its OrderCancelled event's reason and time), written
    # by the order store's cancel in the same UPDATE: what the order's pages and JSON read.
    cancel_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancelled_at = mapped_column(UTCDateTime, nullable=True)
    # The order's fulfilment: when an operator shipped it (None: unfulfilled) and the carrier's
    # tracking number when one was given, written by the order store's ship, once.
    shipped_at = mapped_column(UTCDateTime, nullable=True)
    tracking: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # CAPTURE_MODE=dispatch: when the provider's hold on the payment lapses (the charge's
    # capture_before), written with the Authorized transition; and since when a ship asked for the
    # capture (bookkeeping: the capture command runs once, and no deadline voids the hold meanwhile).
    hold_expires_at = mapped_column(UTCDateTime, nullable=True)
    capture_requested_at = mapped_column(UTCDateTime, nullable=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    # The last state change. The deadline and the sweep derive "how long has it been waiting"
    # from this, never from a scheduled row's own idea of time.
    updated_at = mapped_column(UTCDateTime, default=now_utc, onupdate=now_utc, nullable=False)

    # Loaded when read (one query each), not with every order: a transition, a deadline or a
    # list of orders needs the row only, and eager selectins cost two queries per load.
    lines = relationship("OrderLine", order_by="OrderLine.id", lazy="select")
    refunds = relationship("Refund", order_by="Refund.id", lazy="select", viewonly=True)

    __mapper_args__ = {"version_id_col": version}
    __table_args__ = (
        # The sweep's query: status = X AND updated_at < cutoff ORDER BY updated_at LIMIT n.
        Index("ix_orders_status_updated_at", "status", "updated_at", "id"),
        # The console's search by customer email, whatever its case.
        Index("ix_orders_email_lower", func.lower(email)),
        # The console's date filter (from/to: the days placed), a range scan wherever the days are.
        Index("ix_orders_created_at", "created_at"),
        CheckConstraint("total >= 0", name="total_not_negative"),
        # The payment queue, in arrival order: only the orders waiting in line.
        Index(
            "ix_orders_payment_queue",
            "payment_queued_at",
            "id",
            postgresql_where=payment_queued_at.is_not(None),
            sqlite_where=payment_queued_at.is_not(None),
        ),
        # The to-ship list, oldest first: only the orders on it (shipped and cancelled ones leave it).
        Index("ix_orders_to_ship", "updated_at", "id", postgresql_where=text(TO_SHIP), sqlite_where=text(TO_SHIP)),
    )


class OrderLine(Model):
    __tablename__ = "order_lines"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), index=True)
    variant_id: Mapped[int] = mapped_column(Integer)  # no FK: a line outlives its variant's row
    sku: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(400))
    quantity: Mapped[int] = mapped_column(Integer)
    unit_price: Mapped[int] = mapped_column(Integer)
    # Units of this line an operator's refunds put back in stock (saga.line_restock): never more
    # than were bought, and a later restore of the order gives back only the rest.
    restocked: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)

    __table_args__ = (
        CheckConstraint("quantity > 0", name="quantity_positive"),
        CheckConstraint("restocked >= 0 AND restocked <= quantity", name="restocked_within_quantity"),
    )


@event.listens_for(Session, "before_flush")
def _orders_are_written_by_the_store(session, _flush_context, _instances) -> None:
    """The mapped order is read-only: an ORM write of it would skip the store's version guard, its
    transition rules and its events. The store writes with statements, which never flush."""
    for obj in (*session.new, *session.deleted, *session.dirty):
        if isinstance(obj, (Order, OrderLine)) and (obj not in session.dirty or session.is_modified(obj)):
            raise ReadOnlyOrder(f"{type(obj).__name__} rows are written by the order store only, not by a flush")
