from enum import StrEnum

from flask_login import UserMixin
from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ..extensions import Model
from .types import JSONType, UTCDateTime, now_utc


class WarningState(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"
    DUPLICATE = "duplicate"  # the same problem as another open warning, folded into it


class RestoreWarning(Model):
    """Stock a compensation could not give back (no inventory row, or an invariant refused it).
    It stays open until an operator resolves it."""

    __tablename__ = "restore_warnings"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(Integer, index=True)
    variant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quantity: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default=WarningState.OPEN.value, index=True)
    resolution: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    resolved_at = mapped_column(UTCDateTime, nullable=True)


class CycleStatus(StrEnum):
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  # another process held the sweep's lease


class ReconciliationCycle(Model):
    __tablename__ = "reconciliation_cycles"
    # The dashboard's and /metrics' "last successful sweep": max(finished_at) where status = 'ok',
    # answered from the index's end instead of scanning every cycle ever run.
    __table_args__ = (Index("ix_reconciliation_cycles_status_finished_at", "status", "finished_at"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    started_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)
    finished_at = mapped_column(UTCDateTime, nullable=True)
    cutoff = mapped_column(UTCDateTime, nullable=False)
    status: Mapped[str] = mapped_column(String(20), default=CycleStatus.RUNNING.value)
    expiry_counts = mapped_column(JSONType, nullable=False, default=dict)
    provider_counts = mapped_column(JSONType, nullable=False, default=dict)
    errors = mapped_column(JSONType, nullable=False, default=list)
    # Worth an operator's eye, not an error: ["took over the sweep lease of ..."]. NULL on cycles
    # recorded before the column existed.
    notes = mapped_column(JSONType, nullable=True, default=list)
    holder: Mapped[str] = mapped_column(String(100), default="")


class Lease(Model):
    """A named, expiring lock held in the database, e.g. "only one sweep cycle at a time"."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(100))
    expires_at = mapped_column(UTCDateTime, nullable=False)


class Operator(UserMixin, Model):
    __tablename__ = "operators"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    # Written into the session at login and compared on every console request: raising it (a
    # logout, "log out everywhere", a new password) ends every session of this operator at once,
    # which a signed cookie session cannot do by itself (docs/ARCHITECTURE.md, Console sessions).
    session_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)

    def set_password(self, password_hash: str) -> None:
        """A new password ends every session made with the old one."""
        self.password_hash = password_hash
        self.end_sessions()

    def end_sessions(self) -> None:
        # In SQL (generation + 1), so two requests ending sessions at once both count.
        self.session_generation = type(self).session_generation + 1


class OperatorAction(Model):
    """The audit trail: one row per operator action under /console (retry, retry all, discard,
    reconcile, resolve a warning, and any action added later), whatever its outcome. Written by
    the console blueprint's after-request hook (shop/console/audit.py), so no action can forget it."""

    __tablename__ = "operator_actions"
    id: Mapped[int] = mapped_column(primary_key=True)
    operator: Mapped[str] = mapped_column(String(254))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(200))
    order_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    status: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(Text)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)


class PrunedDetail(Model):
    """What the prune removed of one order's detail (shop.scheduling.retention), so the order's
    console page can say that older detail was pruned, and how much, instead of looking as if it
    never had any. The order and its transitions (its events) are never pruned. One row per order,
    counts added up over every run; no foreign key, like the rows it counts (a webhook receipt may
    name an order id the shop never had, and only known orders are recorded)."""

    __tablename__ = "pruned_order_details"
    order_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    commands: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    webhook_receipts: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    operator_actions: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    first_pruned_at = mapped_column(UTCDateTime, nullable=False)
    last_pruned_at = mapped_column(UTCDateTime, nullable=False)


class EmailResend(Model):
    """An email an operator sent an order's customer again (shop.orders.resend_email): one row
    per submission, so the same click sent twice sends once; the send itself is a `send_email`
    command (`command_id`), retried and dead-lettered like every email."""

    __tablename__ = "email_resends"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), index=True)
    template: Mapped[str] = mapped_column(String(40))
    operator: Mapped[str] = mapped_column(String(254))
    request_key: Mapped[str] = mapped_column(String(64), unique=True)
    command_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)


class StockCorrection(Model):
    """One correction of a variant's stock by an operator (shop.orders.stock): who, when, the
    stock before and after, and why. `mode` is `set` (to a count) or `adjust` (by a delta). One
    row per submission (`request_key`): the same click sent twice corrects once."""

    __tablename__ = "stock_corrections"
    id: Mapped[int] = mapped_column(primary_key=True)
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"), index=True)
    operator: Mapped[str] = mapped_column(String(254))
    mode: Mapped[str] = mapped_column(String(10))
    old_on_hand: Mapped[int] = mapped_column(Integer)
    new_on_hand: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    request_key: Mapped[str] = mapped_column(String(64), unique=True)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)

    @property
    def delta(self) -> int:
        return self.new_on_hand - self.old_on_hand


class CardAcknowledgement(Model):
    """An operator's word that a red dashboard card is known (shop.console.acks): who, why, until
    when, and the card's condition as it was then. The card shows as acknowledged while `until`
    is ahead and its condition is unchanged; a new failure or the end of `until` makes it red
    again. Rows are kept (the newest per card counts) and audited as the action that wrote them."""

    __tablename__ = "card_acknowledgements"
    id: Mapped[int] = mapped_column(primary_key=True)
    card: Mapped[str] = mapped_column(String(40))
    condition: Mapped[str] = mapped_column(String(200))
    operator: Mapped[str] = mapped_column(String(254))
    reason: Mapped[str] = mapped_column(Text)
    until = mapped_column(UTCDateTime, nullable=False)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)

    __table_args__ = (Index("ix_card_acknowledgements_card_created_at", "card", "created_at"),)
