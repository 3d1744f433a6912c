"""Each console list as CSV (`?format=csv` on the list's own URL, with its filters): the rows its
page would list with the same filters, every page of them, as columns selected for the file;
csv_stream.py streams them out in keyset pages and records the download."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import Response
from sqlalchemy import func, select

from ..domain.deadlines import as_utc
from ..domain.order import OrderStatus
from ..domain.refunds import RefundStatus, charged_for, paid_and_refunded
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
# by id (newest first, or oldest first where the page is), the key the keyset pages walk. Each
# names its columns once, header -> what the cell holds (a column, or a _Cell that renders one).


# The sum of an order's succeeded refunds, for each row of the orders' file.
_REFUNDED = (
    select(func.coalesce(func.sum(Refund.amount), 0))
    .where(Refund.order_id == Order.id, Refund.status == RefundStatus.SUCCEEDED)
    .correlate(Order)
    .scalar_subquery()
)


def _money_back(status, total, charged, refunded) -> str:
    if OrderStatus(status) is not OrderStatus.PAID:
        return ""
    return paid_and_refunded(charged_for(total, charged), refunded or 0)


def orders_csv(now: datetime, *, stuck: bool, statuses: list[str], filters) -> Response:
    fields = {
        **_own(Order, "reference", "status"),
        "total": _money(Order.total, Order.currency),
        "currency": _upper(Order.currency),
        **_own(Order, "email", "payment_attempts"),
        **_times(Order, "created_at", "updated_at"),
        # A paid order's money: `paid`, `partially_refunded` or `refunded`, and what went back.
        "payment": _Cell((Order.status, Order.total, Order.charged, _REFUNDED), _money_back),
        "refunded": _money(_REFUNDED, Order.currency),
    }
    query = _select(Order.id, fields).where(*order_conditions(now, stuck=stuck, statuses=statuses, filters=filters))
    return _download("orders", now, query, Order.id, fields)


def refunds_csv(now: datetime, *, status: str | None, filters) -> Response:
    fields = {
        "id": Refund.id,
        "order_reference": Order.reference,
        "amount": _money(Refund.amount, Refund.currency),
        "currency": _upper(Refund.currency),
        **_own(Refund, "status", "reason", "attempts", "provider_refund_id", "failure_reason"),
        **_times(Refund, "settled_at", "created_at"),
    }
    query = (
        _select(Refund.id, fields).join(Order, Order.id == Refund.order_id).where(*refund_conditions(status, filters))
    )
    return _download("refunds", now, query, Refund.id, fields, descending=False)


def deliveries_csv(now: datetime, *, status: str | None, filters) -> Response:
    fields = {
        "id": OutboxDelivery.id,
        "event": OutboxEvent.name,
        **_own(OutboxDelivery, "handler", "status", "attempts", "last_error"),
        "order_reference": Order.reference,
        **_times(OutboxDelivery, "created_at"),
    }
    return _beside_order(
        "outbox-deliveries",
        now,
        OutboxDelivery,
        fields,
        delivery_conditions(status, filters),
        joined=(OutboxEvent, OutboxEvent.id == OutboxDelivery.event_id),
        descending=False,
    )


def commands_csv(now: datetime, *, status: str | None, filters) -> Response:
    """The outbox's scheduled commands (deadlines, refunds, emails, ...), oldest first."""
    fields = {
        "id": _Cell((ScheduledCommand.id,), lambda id_: f"cmd-{id_}"),
        **_own(ScheduledCommand, "kind", "status", "attempts", "last_error"),
        "order_reference": Order.reference,
        "due_at": _when(ScheduledCommand.next_attempt_at),
        **_times(ScheduledCommand, "created_at"),
    }
    conditions = command_conditions(status, filters)
    return _beside_order("outbox-commands", now, ScheduledCommand, fields, conditions, descending=False)


def audit_csv(now: datetime, *, operator: str, filters) -> Response:
    """The audit trail, newest first."""
    fields = {
        "id": OperatorAction.id,
        "at": _when(OperatorAction.created_at),
        **_own(OperatorAction, "operator", "action", "target"),
        "order_reference": Order.reference,
        **_own(OperatorAction, "reason", "status", "outcome"),
    }
    return _beside_order("audit", now, OperatorAction, fields, audit_conditions(operator, filters))


def warnings_csv(now: datetime, *, state: str | None, filters) -> Response:
    """The restore warnings, oldest first."""
    fields = {
        "id": RestoreWarning.id,
        "order_reference": Order.reference,
        **_own(RestoreWarning, "variant_id", "quantity", "reason", "state", "resolution"),
        **_times(RestoreWarning, "created_at", "resolved_at"),
    }
    conditions = warning_conditions(state, filters)
    return _beside_order("restore-warnings", now, RestoreWarning, fields, conditions, descending=False)


def webhooks_csv(now: datetime, *, outcome: str | None, filters, signed: bool | None = None) -> Response:
    fields = {
        "id": WebhookReceipt.id,
        **_times(WebhookReceipt, "received_at"),
        **_own(WebhookReceipt, "event_id", "event_type", "outcome", "reason", "http_status"),
        "order_reference": Order.reference,
    }
    conditions = webhook_conditions(outcome, filters, signed)
    return _beside_order("webhooks", now, WebhookReceipt, fields, conditions)


def _beside_order(name: str, now: datetime, model, fields: dict, conditions, *, joined=None, descending=True):
    """The CSV of the rows of `model` (keyed by its id) under the list's `conditions`, each beside
    its order if it has one (the `order_reference` column); `joined` a table and its join's on."""
    query = _select(model.id, fields)
    if joined is not None:
        query = query.join(*joined)
    query = query.outerjoin(Order, Order.id == model.order_id).where(*conditions)
    return _download(name, now, query, model.id, fields, descending=descending)


# -- the columns ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cell:
    """A cell made from one or more columns of the row by `render` (their values, in order)."""

    columns: tuple
    render: Callable[..., Any]


def _as_is(value):
    return value


def _own(model, *names: str) -> dict:
    """Columns of `model` exported under their own names, as they are stored."""
    return {name: getattr(model, name) for name in names}


def _times(model, *names: str) -> dict:
    """Times of `model` under their own names (as _when renders them)."""
    return {name: _when(getattr(model, name)) for name in names}


def _when(column) -> _Cell:
    """A time as ISO 8601 in UTC, empty when there is none."""
    return _Cell((column,), lambda value: iso(as_utc(value)) if value else None)


def _money(amount, currency) -> _Cell:
    """An amount in the currency's own units, as the filters take it ("18.00")."""
    return _Cell((amount, currency), major_units)


def _upper(column) -> _Cell:
    return _Cell((column,), lambda value: (value or "").upper())


def _cells(fields: dict) -> list[_Cell]:
    return [f if isinstance(f, _Cell) else _Cell((f,), _as_is) for f in fields.values()]


def _select(key, fields: dict):
    """The select of the keyset's `key` (read back by its own name) and every column the cells
    read, each labelled by its place, so a column two cells read (a currency) is selected twice
    rather than folded into one."""
    columns = [column for cell in _cells(fields) for column in cell.columns]
    return select(key, *(column.label(f"c{i}") for i, column in enumerate(columns)))


def _download(name: str, now: datetime, query, key, fields: dict, *, descending: bool = True) -> Response:
    """The CSV of `query` (made by _select from `fields`), its header the fields' names."""
    cells = _cells(fields)

    def shape(row) -> list:
        values = iter(row[1:])  # after the key
        return [cell.render(*(next(values) for _ in cell.columns)) for cell in cells]

    return csv_response(name, tuple(fields), keyset_rows(query, key, descending=descending), shape, now)
