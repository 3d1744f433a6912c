"""Each console list as CSV (`?format=csv` on the list's own URL, with its filters): the rows its
page would list with the same filters, every page of them, as columns selected for the file;
csv_stream.py streams them out in keyset pages and records the download."""

from __future__ import annotations

import logging
from datetime import datetime

from flask import Response
from sqlalchemy import select

from ..domain.deadlines import as_utc
from ..domain.timestamps import iso
from ..models import (
    OperatorAction,
    Order,
    OutboxDelivery,
    OutboxEvent,
    Refund,
    RestoreWarning,
    ScheduledCommand,
    WebhookReceipt,
)
from .csv_stream import csv_response, keyset_rows
from .outbox_queries import command_conditions, delivery_conditions
from .queries import (
    audit_conditions,
    order_conditions,
    refund_conditions,
    warning_conditions,
    webhook_conditions,
)
from .search import major_units

log = logging.getLogger("shop.console")


def wants_csv(args) -> bool:
    return (args.get("format") or "").lower() == "csv"


# -- the lists --------------------------------------------------------------------------------
# Each exports the rows its page would list with the same filters, every page of them; ordered
# by id (newest first, or oldest first where the page is), the key the keyset pages walk.


def orders_csv(now: datetime, *, stuck: bool, statuses: list[str], filters) -> Response:
    query = select(
        Order.id,
        Order.reference,
        Order.status,
        Order.total,
        Order.currency,
        Order.email,
        Order.payment_attempts,
        Order.created_at,
        Order.updated_at,
    ).where(*order_conditions(now, stuck=stuck, statuses=statuses, filters=filters))
    header = ("reference", "status", "total", "currency", "email", "payment_attempts", "created_at", "updated_at")

    def shape(r):
        return [
            r.reference,
            r.status,
            major_units(r.total, r.currency),
            (r.currency or "").upper(),
            r.email,
            r.payment_attempts,
            iso(as_utc(r.created_at)),
            iso(as_utc(r.updated_at)),
        ]

    return csv_response("orders", header, keyset_rows(query, Order.id), shape, now)


def refunds_csv(now: datetime, *, status: str | None, filters) -> Response:
    query = (
        select(
            Refund.id,
            Order.reference,
            Refund.amount,
            Refund.currency,
            Refund.status,
            Refund.reason,
            Refund.attempts,
            Refund.provider_refund_id,
            Refund.failure_reason,
            Refund.settled_at,
            Refund.created_at,
        )
        .join(Order, Order.id == Refund.order_id)
        .where(*refund_conditions(status, filters))
    )
    header = (
        "id",
        "order_reference",
        "amount",
        "currency",
        "status",
        "reason",
        "attempts",
        "provider_refund_id",
        "failure_reason",
        "settled_at",
        "created_at",
    )

    def shape(r):
        return [
            r.id,
            r.reference,
            major_units(r.amount, r.currency),
            (r.currency or "").upper(),
            r.status,
            r.reason,
            r.attempts,
            r.provider_refund_id,
            r.failure_reason,
            iso(as_utc(r.settled_at)) if r.settled_at else "",
            iso(as_utc(r.created_at)),
        ]

    return csv_response("refunds", header, keyset_rows(query, Refund.id, descending=False), shape, now)


def deliveries_csv(now: datetime, *, status: str | None, filters) -> Response:
    query = (
        select(
            OutboxDelivery.id,
            OutboxEvent.name,
            OutboxDelivery.handler,
            OutboxDelivery.status,
            OutboxDelivery.attempts,
            OutboxDelivery.last_error,
            Order.reference,
            OutboxDelivery.created_at,
        )
        .join(OutboxEvent, OutboxEvent.id == OutboxDelivery.event_id)
        .outerjoin(Order, Order.id == OutboxDelivery.order_id)
        .where(*delivery_conditions(status, filters))
    )
    header = ("id", "event", "handler", "status", "attempts", "last_error", "order_reference", "created_at")

    def shape(r):
        return [
            r.id,
            r.name,
            r.handler,
            r.status,
            r.attempts,
            r.last_error,
            r.reference,
            iso(as_utc(r.created_at)),
        ]

    return csv_response(
        "outbox-deliveries", header, keyset_rows(query, OutboxDelivery.id, descending=False), shape, now
    )


def commands_csv(now: datetime, *, status: str | None, filters) -> Response:
    """The outbox's scheduled commands (deadlines, refunds, emails, ...), oldest first."""
    query = (
        select(
            ScheduledCommand.id,
            ScheduledCommand.kind,
            ScheduledCommand.status,
            ScheduledCommand.attempts,
            ScheduledCommand.last_error,
            Order.reference,
            ScheduledCommand.next_attempt_at,
            ScheduledCommand.created_at,
        )
        .outerjoin(Order, Order.id == ScheduledCommand.order_id)
        .where(*command_conditions(status, filters))
    )
    header = ("id", "kind", "status", "attempts", "last_error", "order_reference", "due_at", "created_at")

    def shape(r):
        return [
            f"cmd-{r.id}",
            r.kind,
            r.status,
            r.attempts,
            r.last_error,
            r.reference,
            iso(as_utc(r.next_attempt_at)) if r.next_attempt_at else None,
            iso(as_utc(r.created_at)),
        ]

    return csv_response(
        "outbox-commands", header, keyset_rows(query, ScheduledCommand.id, descending=False), shape, now
    )


def audit_csv(now: datetime, *, operator: str, filters) -> Response:
    """The audit trail, newest first."""
    query = (
        select(
            OperatorAction.id,
            OperatorAction.created_at,
            OperatorAction.operator,
            OperatorAction.action,
            OperatorAction.target,
            Order.reference,
            OperatorAction.reason,
            OperatorAction.status,
            OperatorAction.outcome,
        )
        .outerjoin(Order, Order.id == OperatorAction.order_id)
        .where(*audit_conditions(operator, filters))
    )
    header = ("id", "at", "operator", "action", "target", "order_reference", "reason", "status", "outcome")

    def shape(r):
        return [
            r.id,
            iso(as_utc(r.created_at)),
            r.operator,
            r.action,
            r.target,
            r.reference,
            r.reason,
            r.status,
            r.outcome,
        ]

    return csv_response("audit", header, keyset_rows(query, OperatorAction.id), shape, now)


def warnings_csv(now: datetime, *, state: str | None, filters) -> Response:
    """The restore warnings, oldest first."""
    query = (
        select(
            RestoreWarning.id,
            Order.reference,
            RestoreWarning.variant_id,
            RestoreWarning.quantity,
            RestoreWarning.reason,
            RestoreWarning.state,
            RestoreWarning.resolution,
            RestoreWarning.created_at,
            RestoreWarning.resolved_at,
        )
        .outerjoin(Order, Order.id == RestoreWarning.order_id)
        .where(*warning_conditions(state, filters))
    )
    header = (
        "id",
        "order_reference",
        "variant_id",
        "quantity",
        "reason",
        "state",
        "resolution",
        "created_at",
        "resolved_at",
    )

    def shape(r):
        return [
            r.id,
            r.reference,
            r.variant_id,
            r.quantity,
            r.reason,
            r.state,
            r.resolution,
            iso(as_utc(r.created_at)),
            iso(as_utc(r.resolved_at)) if r.resolved_at else None,
        ]

    return csv_response("restore-warnings", header, keyset_rows(query, RestoreWarning.id, descending=False), shape, now)


def webhooks_csv(now: datetime, *, outcome: str | None, filters, signed: bool | None = None) -> Response:
    query = (
        select(
            WebhookReceipt.id,
            WebhookReceipt.received_at,
            WebhookReceipt.event_id,
            WebhookReceipt.event_type,
            WebhookReceipt.outcome,
            WebhookReceipt.reason,
            WebhookReceipt.http_status,
            Order.reference,
        )
        .outerjoin(Order, Order.id == WebhookReceipt.order_id)
        .where(*webhook_conditions(outcome, filters, signed))
    )
    header = ("id", "received_at", "event_id", "event_type", "outcome", "reason", "http_status", "order_reference")

    def shape(r):
        return [
            r.id,
            iso(as_utc(r.received_at)),
            r.event_id,
            r.event_type,
            r.outcome,
            r.reason,
            r.http_status,
            r.reference,
        ]

    return csv_response("webhooks", header, keyset_rows(query, WebhookReceipt.id), shape, now)
