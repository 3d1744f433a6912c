from enum import StrEnum
from typing import TYPE_CHECKING

from sqlalchemy import ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, declared_attr, mapped_column, relationship

from ..extensions import Model
from .types import JSONType, UTCDateTime, now_utc


class OutboxEvent(Model):
    """A domain event, written in the same transaction as the state change that raised it.
    It is also the order's timeline of transitions."""

    __tablename__ = "outbox_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int | None] = mapped_column(Integer, index=True, nullable=True)
    name: Mapped[str] = mapped_column(String(64))
    payload = mapped_column(JSONType, nullable=False)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    deliveries = relationship("OutboxDelivery", back_populates="event", order_by="OutboxDelivery.id")

    # The dashboard's charts count orders placed, paid and cancelled per minute of the last hour:
    # one range scan per event name, however many events came before.
    __table_args__ = (Index("ix_outbox_events_name_created_at", "name", "created_at"),)


class WorkStatus(StrEnum):
    """Where a unit of durable work is (see DurableWork); `obsolete`: a command whose order moved
    on (a paid order's deadline), kept for the timeline."""

    PENDING = "pending"
    PROCESSING = "processing"
    DONE = "done"
    DEAD = "dead"
    DISCARDED = "discarded"
    OBSOLETE = "obsolete"


class DurableWork:
    """Columns shared by every unit of durable background work (a delivery of an event to one
    handler, or a scheduled command): the database row, not Redis, is the source of truth.

    status: pending -> processing (claimed, with a lease) -> done | pending (retry) | dead.
    A row whose provider is unavailable stays pending (failure_kind "provider"): it is waiting
    for the provider, not failing, and is never dead-lettered for it.
    An operator may retry a dead row (fresh attempt budget) or discard it (with a reason).
    """

    if TYPE_CHECKING:
        # Each concrete table names itself; __table_args__ below reads it.
        __tablename__: str

    status: Mapped[str] = mapped_column(String(16), default=WorkStatus.PENDING.value, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    max_attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=5)
    next_attempt_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    # When it was last handed to Redis; the relay leaves a row alone for a grace period after.
    enqueued_at = mapped_column(UTCDateTime, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(100), nullable=True)
    claimed_until = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_traceback: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Why the last attempt failed (domain.deadlines.FailureKind): "provider" while the row waits
    # for an unavailable provider, which is retried without spending the attempt budget, and
    # "refused" for a dead letter retrying cannot help.
    failure_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Provider failures in a row: the exponent of the wait for the provider.
    # Left to the database default: the writer inserts deliveries with INSERT ... SELECT.
    provider_waits: Mapped[int] = mapped_column(Integer, server_default="0", nullable=False)
    discard_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The id of the web request whose commit wrote the row (or of the request behind the row
    # whose run wrote it), for the log lines of whoever runs it (shop.logs); null when no request
    # was behind it (the sweep, the CLI).
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Beside it, with tracing on (shop.traces): the W3C traceparent of the span whose commit wrote
    # the row, so the span that runs it is that span's child, in the same trace; null otherwise.
    traceparent: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    updated_at = mapped_column(UTCDateTime, default=now_utc, onupdate=now_utc, nullable=False)
    completed_at = mapped_column(UTCDateTime, nullable=True)

    @declared_attr.directive
    def __table_args__(cls):
        # Partial: only pending rows that failed (a few, during an outage), so the writer's hot
        # inserts never touch it. Serves the outbox's "waiting for the provider" list and /metrics.
        waiting = text("status = 'pending' AND failure_kind IS NOT NULL")
        return (
            Index(f"ix_{cls.__tablename__}_status_next", "status", "next_attempt_at"),
            Index(
                f"ix_{cls.__tablename__}_pending_failure_kind",
                "failure_kind",
                postgresql_where=waiting,
                sqlite_where=waiting,
            ),
        ) + tuple(getattr(cls, "_extra_table_args", ()))


class OutboxDelivery(DurableWork, Model):
    """One (event, handler) pair: a failing handler is retried alone, its siblings never re-run."""

    __tablename__ = "outbox_deliveries"
    id: Mapped[int] = mapped_column(primary_key=True)
    event_id: Mapped[int] = mapped_column(ForeignKey("outbox_events.id"), index=True)
    handler: Mapped[str] = mapped_column(String(64))
    order_id: Mapped[int | None] = mapped_column(Integer, index=True, nullable=True)
    event = relationship("OutboxEvent", back_populates="deliveries")

    _extra_table_args = (
        UniqueConstraint("event_id", "handler", name="uq_outbox_deliveries_event_handler"),
        # The dashboard's outbox-lag chart reads the deliveries finished in the last hour.
        Index("ix_outbox_deliveries_completed_at", "completed_at"),
    )


class CommandKind(StrEnum):
    """What a scheduled command does (`scheduled_commands.kind`); shop.scheduling.commands runs each."""

    EXPIRE_UNPAID_ORDER = "expire_unpaid_order"  # an unpaid order's payment deadline
    SEND_EMAIL = "send_email"  # payload: the template
    REFUND_PAYMENT = "refund_payment"  # payload: the refund's row
    SETTLE_UNKNOWN_PAYMENT = "settle_unknown_payment"  # payload: the unknown payment's row
    OFFER_PAYMENT_LINK = "offer_payment_link"  # email a payment link while the provider was down
    CAPTURE_PAYMENT = "capture_payment"  # an Authorized order shipped: payload the tracking number
    END_HOLD = "end_hold"  # an unshipped Authorized order's hold about to lapse: void and cancel
    VOID_PAYMENT = "void_payment"  # a hold the order will not take: payload its session (and payment)


class ScheduledCommand(DurableWork, Model):
    """Work that must happen at a time (an order's payment deadline, an email, a refund),
    armed in the same transaction as the fact that makes it necessary."""

    __tablename__ = "scheduled_commands"
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(40))
    order_id: Mapped[int | None] = mapped_column(Integer, index=True, nullable=True)
    payload = mapped_column(JSONType, nullable=False, default=dict)

    # The prune's selection: finished commands by age. Partial, so the checkout's inserts of
    # pending commands (completed_at NULL) never touch it.
    _extra_table_args = (
        Index(
            "ix_scheduled_commands_completed_at",
            "completed_at",
            postgresql_where=text("completed_at IS NOT NULL"),
            sqlite_where=text("completed_at IS NOT NULL"),
        ),
    )
