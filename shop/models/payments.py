from enum import StrEnum

from sqlalchemy import Boolean, CheckConstraint, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false, text
from sqlalchemy.orm import Mapped, mapped_column

from ..extensions import Model
from .types import UTCDateTime, now_utc


class ReceiptOutcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # an event already applied
    IGNORED = "ignored"  # verified, but nothing the shop acts on
    REJECTED = "rejected"  # not verified: bad signature, too old, too big, not JSON
    FAILED = "failed"  # verified, but applying it failed (the provider retries it)


class WebhookReceipt(Model):
    """Every delivery the webhook received, accepted or rejected, for the console."""

    __tablename__ = "webhook_receipts"
    id: Mapped[int] = mapped_column(primary_key=True)
    event_id: Mapped[str | None] = mapped_column(String(255), index=True, nullable=True)
    event_type: Mapped[str | None] = mapped_column(String(100), nullable=True)
    outcome: Mapped[str] = mapped_column(String(20))  # a ReceiptOutcome
    reason: Mapped[str] = mapped_column(Text, default="")
    order_id: Mapped[int | None] = mapped_column(Integer, index=True, nullable=True)
    http_status: Mapped[int] = mapped_column(Integer)
    received_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)
    # The evidence (kept as long as the receipt, shop.scheduling.retention): the address the
    # delivery came from (as the trusted proxies name it: shop.web.proxies), the raw body
    # as received (a delivery that did not verify keeps only its first NOISE_BODY_CHARS), and
    # whether its signature verified: False is noise from anyone on the internet, True the
    # provider's own delivery, NULL a receipt older than the column or no secret to check with.
    source_address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    body: Mapped[str | None] = mapped_column(Text, nullable=True)
    signed: Mapped[bool | None] = mapped_column(Boolean, nullable=True)

    # The dashboard counts the rejected ones of the last 24 h, and the list filters by outcome,
    # newest first: both one range scan, however many accepted ones there are.
    __table_args__ = (Index("ix_webhook_receipts_outcome_received_at", "outcome", "received_at"),)


class ProcessedStripeEvent(Model):
    """Dedup: inserted in the same transaction as the transition an event causes."""

    __tablename__ = "processed_stripe_events"
    event_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # Indexed for the prune, which removes them by age (shop.domain.retention).
    processed_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)


class PaymentProofRefusal(Model):
    """A paid session that did not prove payment of its order (amount/currency mismatch)."""

    __tablename__ = "payment_proof_refusals"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(Integer, index=True)
    session_id: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(20))
    problems: Mapped[str] = mapped_column(Text)
    amount_total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    currency: Mapped[str | None] = mapped_column(String(3), nullable=True)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)


class RefusalKind(StrEnum):
    """Why a payment did not start (`provider_refusals.kind`)."""

    REFUSED = "refused"  # a 4xx: the provider said no
    UNAVAILABLE = "unavailable"  # it could not be reached, failed, or the breaker did not call it


class ProviderRefusal(Model):
    """The provider said no to starting a payment (a 4xx on session creation): the reason an
    operator sees on the order's timeline, since the customer is only told that it failed."""

    __tablename__ = "provider_refusals"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    code: Mapped[str | None] = mapped_column(String(100), nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    # A RefusalKind: either way the order's payment did not start.
    kind: Mapped[str] = mapped_column(
        String(20), default=RefusalKind.REFUSED.value, server_default=RefusalKind.REFUSED.value
    )


class Refund(Model):
    """Money that arrived for an order that cannot take it. One per (order, session): a second
    notice of the same payment finds the row and refunds nothing more.

    The row follows the refund's current attempt at the provider (shop.domain.refunds): its
    `status` is what the provider last said about it, `provider_refund_id` names it (the
    webhook and the sweep find the row by it), and `attempts` counts the refunds made at the
    provider for this money, each with its own Idempotency-Key. A refund whose money did not go
    back (failed, canceled) waits for an operator: a retry starts the next attempt; settling it
    outside the shop leaves the provider's status and records who, when and why."""

    __tablename__ = "refunds"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), index=True)
    session_id: Mapped[str] = mapped_column(String(255))
    payment_intent_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    amount: Mapped[int] = mapped_column(Integer)
    currency: Mapped[str] = mapped_column(String(3))
    reason: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), default="pending")  # a domain.refunds.RefundStatus
    provider_refund_id: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1", nullable=False)
    # The provider's reason when the current attempt failed (Stripe's `failure_reason`:
    # expired_or_canceled_card, lost_or_stolen_card, ...), and when it said so.
    failure_reason: Mapped[str | None] = mapped_column(String(100), nullable=True)
    failed_at = mapped_column(UTCDateTime, nullable=True)
    settled_at = mapped_column(UTCDateTime, nullable=True)
    settled_by: Mapped[str | None] = mapped_column(String(254), nullable=True)
    settlement_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # An operator's refund of a paid order (shop.payments.operator_refunds): the key of the
    # submission that asked for it (a double submit finds this row and refunds nothing more), who
    # asked, and whether the order's stock was given back with it. Null for late money.
    request_key: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True)
    requested_by: Mapped[str | None] = mapped_column(String(254), nullable=True)
    restock: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(), nullable=False)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    updated_at = mapped_column(UTCDateTime, default=now_utc, onupdate=now_utc, nullable=False)

    # Late money: one refund per (order, session). An operator may refund a paid order's session
    # in several parts, each its own row with its own request key.
    __table_args__ = (
        Index(
            "uq_refunds_order_session",
            "order_id",
            "session_id",
            unique=True,
            postgresql_where=text("request_key IS NULL"),
            sqlite_where=text("request_key IS NULL"),
        ),
        # The sweep's follow-up of pending refunds (scheduling.passes.pending_refunds): the few
        # pending ones, oldest news first, however many refunds the years left.
        Index(
            "ix_refunds_pending_updated_at",
            "updated_at",
            postgresql_where=text("status = 'pending'"),
            sqlite_where=text("status = 'pending'"),
        ),
    )

    @property
    def by_operator(self) -> bool:
        return self.request_key is not None


class RefundRestock(Model):
    """What one operator's refund put back in stock, line by line (saga.line_restock): written in
    the refund's transaction, once per (refund, line), with the stock before and after."""

    __tablename__ = "refund_restocks"
    id: Mapped[int] = mapped_column(primary_key=True)
    refund_id: Mapped[int] = mapped_column(ForeignKey("refunds.id"))
    line_id: Mapped[int] = mapped_column(ForeignKey("order_lines.id"))
    variant_id: Mapped[int] = mapped_column(Integer)
    sku: Mapped[str] = mapped_column(String(64))
    quantity: Mapped[int] = mapped_column(Integer)
    on_hand_before: Mapped[int] = mapped_column(Integer)
    on_hand_after: Mapped[int] = mapped_column(Integer)

    __table_args__ = (
        UniqueConstraint("refund_id", "line_id"),
        CheckConstraint("quantity > 0", name="quantity_positive"),
    )


class KeyValue(Model):
    """Small shared settings every process reads (the webhook signing secret lives here)."""

    __tablename__ = "kv_store"
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at = mapped_column(UTCDateTime, default=now_utc, onupdate=now_utc, nullable=False)


class UnknownPaymentStatus(StrEnum):
    CHECKING = "checking"  # found; the provider is being asked whether it is real and paid
    APPLIED = "applied"  # the provider's answer found the order after all, and was applied to it
    NOT_PAID = "not_paid"  # the provider says the session took no money: nothing to give back
    REFUND_PENDING = "refund_pending"  # refunded at the provider, which has not confirmed yet
    REFUNDED = "refunded"
    REFUND_FAILED = "refund_failed"  # the provider could not give it back: an operator acts
    NOT_OURS = "not_ours"  # paid, but not marked as this shop's session: never refunded automatically
    VOIDED = "voided"  # only held (CAPTURE_MODE=dispatch), never taken: the hold was released


class UnknownPayment(Model):
    """Money the provider holds for a Checkout Session that names no order this database knows:
    a database restored from a copy older than the payment, say. Found by the signed webhook or
    by the sweep's scan of the provider's completed sessions (shop.payments.unknown_money); it
    is checked against the provider, then applied to its order if one turns up, else refunded
    (never kept). One row per session: a second sighting changes nothing."""

    __tablename__ = "unknown_payments"
    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(String(255), unique=True)
    payment_intent_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    amount: Mapped[int | None] = mapped_column(Integer, nullable=True)
    currency: Mapped[str | None] = mapped_column(String(3), nullable=True)
    reference: Mapped[str | None] = mapped_column(String(255), nullable=True)  # the session's client_reference_id
    found_via: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(20), default=UnknownPaymentStatus.CHECKING)
    provider_refund_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)
    updated_at = mapped_column(UTCDateTime, default=now_utc, onupdate=now_utc, nullable=False)
