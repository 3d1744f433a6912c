"""What the prune removes (docs/ARCHITECTURE.md, Retention): each kind of row, its table, the indexed
column its age is read from, the cutoff it is held to (shop.domain.retention), what else must be
true of a row to go (finished, and naming no order still owed something), and which PrunedDetail
column counts it on its order. retention.py removes them, batch by batch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from sqlalchemy import and_, func, or_, select

from ..domain import refunds as refund_rules
from ..domain.order import FINAL, OrderStatus
from ..domain.retention import Cutoffs
from ..models import (
    CardAcknowledgement,
    CycleStatus,
    EmailResend,
    IdempotentRequest,
    OperatorAction,
    Order,
    OutboxDelivery,
    ProcessedStripeEvent,
    ReconciliationCycle,
    Refund,
    RestoreWarning,
    ScheduledCommand,
    StockCorrection,
    WarningState,
    WebhookReceipt,
    WorkStatus,
)
from ..outbox.tables import table_of


@dataclass(frozen=True)
class Kind:
    """One kind of row the prune removes: its table, the column its age is read from (indexed),
    the cutoff it is held to, what else must be true of a row to go, and, for rows naming an
    order, which PrunedDetail column counts them."""

    name: str
    words: str
    model: type
    age: str
    cutoff: Callable[[Cutoffs], datetime]
    conditions: Callable[[], list]
    counted_as: str | None = None

    @property
    def table(self):
        return self.model.__table__

    @property
    def key(self):
        return self.table.primary_key.columns.values()[0]


def _owes_nothing(table):
    """The row names no order that is still owed something: live (not Paid or Cancelled), watched
    for late money, with a refund whose money is not back and not settled by an operator, cancelled
    with its stock not back yet, or with an open restore warning. A row naming no order, or an
    order id the shop never had, owes nothing. (The order is read through its mapped columns:
    only the order store handles the table itself.)"""
    refund_owed = (
        select(1)
        .where(
            Refund.order_id == Order.id,
            or_(
                Refund.status == refund_rules.PENDING,
                and_(Refund.status.in_(refund_rules.NOT_RETURNED), Refund.settled_at.is_(None)),
            ),
        )
        .exists()
    )
    warning_open = (
        select(1).where(RestoreWarning.order_id == Order.id, RestoreWarning.state == WarningState.OPEN).exists()
    )
    held = or_(
        Order.status.not_in(FINAL),
        Order.late_money_watch_since.is_not(None),
        and_(Order.status == OrderStatus.CANCELLED, Order.inventory_restored.is_(False)),
        refund_owed,
        warning_open,
    )
    return ~select(1).where(Order.id == table.c.order_id, held).exists()


def _deliveries() -> list:
    t = table_of(OutboxDelivery)
    return [t.c.status.in_((WorkStatus.DONE, WorkStatus.DISCARDED)), _owes_nothing(t)]


def _commands() -> list:
    t = table_of(ScheduledCommand)
    return [t.c.status.in_((WorkStatus.DONE, WorkStatus.OBSOLETE)), _owes_nothing(t)]


def _receipts() -> list:
    return [_owes_nothing(WebhookReceipt.__table__)]


def _cycles() -> list:
    """Finished cycles, except the newest ok one: "the last successful sweep" (the dashboard,
    /metrics) must still have an answer after a month without one."""
    t = ReconciliationCycle.__table__
    ok = t.alias("ok_cycles")
    last_ok = select(func.coalesce(func.max(ok.c.id), 0)).where(ok.c.status == CycleStatus.OK).scalar_subquery()
    return [t.c.status != CycleStatus.RUNNING, t.c.id != last_ok]


def _audit() -> list:
    return [_owes_nothing(OperatorAction.__table__)]


KINDS = (
    Kind(
        "deliveries",
        "event deliveries (done or discarded)",
        OutboxDelivery,
        "completed_at",
        lambda c: c.work,
        _deliveries,
        "deliveries",
    ),
    Kind(
        "commands",
        "scheduled commands (done or obsolete)",
        ScheduledCommand,
        "completed_at",
        lambda c: c.work,
        _commands,
        "commands",
    ),
    Kind(
        "webhook_receipts",
        "webhook receipts",
        WebhookReceipt,
        "received_at",
        lambda c: c.receipts,
        _receipts,
        "webhook_receipts",
    ),
    Kind(
        "provider_events",
        "applied provider events (dedup)",
        ProcessedStripeEvent,
        "processed_at",
        lambda c: c.provider_events,
        lambda: [],
    ),
    Kind("sweep_cycles", "sweep cycles", ReconciliationCycle, "started_at", lambda c: c.cycles, _cycles),
    Kind(
        "operator_actions",
        "operator actions (audit)",
        OperatorAction,
        "created_at",
        lambda c: c.audit,
        _audit,
        "operator_actions",
    ),
    # An operator's other records, kept as long as the audit trail that names them: an email sent
    # again (of an order that owes nothing), a stock correction, a card's acknowledgement.
    Kind(
        "email_resends",
        "emails sent again (audit)",
        EmailResend,
        "created_at",
        lambda c: c.audit,
        lambda: [_owes_nothing(EmailResend.__table__)],
    ),
    Kind(
        "stock_corrections",
        "stock corrections (audit)",
        StockCorrection,
        "created_at",
        lambda c: c.audit,
        lambda: [],
    ),
    Kind(
        "idempotent_requests",
        "first answers kept for retried requests (Idempotency-Key)",
        IdempotentRequest,
        "created_at",
        lambda c: c.answers,
        lambda: [],
    ),
    Kind(
        "card_acknowledgements",
        "card acknowledgements (audit)",
        CardAcknowledgement,
        "created_at",
        lambda c: c.audit,
        lambda: [],
    ),
)
