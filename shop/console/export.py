"""A console list as CSV (`?format=csv` on the list's own URL, with its filters): streamed, so a
million rows go out without a million rows in memory. The rows are read in keyset pages of
CHUNK (`WHERE id < last id ORDER BY id DESC LIMIT CHUNK`, each an index range scan however deep
into the list it is, where OFFSET would read every row before the page again), selected as plain
columns so the session's identity map does not keep them, and written out as each page arrives.

A cell is text a spreadsheet may evaluate: one that starts with `=`, `+`, `-`, `@`, a tab or a
carriage return is a formula to Excel and LibreOffice (an email address such as
`=HYPERLINK(...)@example.com` is a valid one), so it is written with a leading `'`, which the
spreadsheet shows as text (OWASP, "CSV Injection")."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

from flask import Response, request, stream_with_context
from flask_login import current_user
from sqlalchemy import select

from ..domain.deadlines import as_utc
from ..domain.timestamps import iso
from ..extensions import db
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
from .queries import (
    audit_conditions,
    order_conditions,
    refund_conditions,
    warning_conditions,
    webhook_conditions,
)
from .outbox_queries import command_conditions, delivery_conditions
from .search import major_units

log = logging.getLogger("shop.console")

# Rows per keyset page: big enough that the round trips do not dominate, small enough that a page
# of wide rows stays a few hundred kilobytes.
CHUNK = 1000
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value) -> str:
    """One cell as text a spreadsheet shows and never runs."""
    if value is None:
        return ""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def keyset_rows(query, key, *, descending: bool = True, chunk: int | None = None) -> Iterator:
    """Every row of `query` (a select of columns, filtered, unordered), ordered by `key` (a unique
    column also selected, read back from each row as `row.<key name>`), read CHUNK rows at a time."""
    size = chunk or CHUNK
    ordered = key.desc() if descending else key.asc()
    last = None
    while True:
        page = query
        if last is not None:
            page = page.where(key < last if descending else key > last)
        rows = db.session.execute(page.order_by(ordered).limit(size)).all()
        # Each page its own short read: the connection goes back to the pool (and PgBouncer's
        # server connection to others) while a slow client takes the rows, instead of the whole
        # download holding one transaction open.
        db.session.rollback()
        yield from rows
        if len(rows) < size:
            return
        last = getattr(rows[-1], key.key)


def csv_response(name: str, header: Iterable[str], rows: Iterable, shape: Callable, now: datetime) -> Response:
    """A streamed CSV download: `header` first, then `shape(row)` (a list of cells) for each of
    `rows`, which are read as the download goes (the request's app context stays open until the
    last row is sent). The download is on the audit trail before it starts."""
    _audit_download(name, now)

    def lines():
        buffer = io.StringIO()
        writer = csv.writer(buffer)

        # Bytes: a direct_passthrough body goes to the server as it is, unencoded.
        def flush() -> bytes:
            text = buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
            return text.encode("utf-8")

        writer.writerow([safe_cell(h) for h in header])
        yield flush()
        pending = 0
        for row in rows:
            writer.writerow([safe_cell(c) for c in shape(row)])
            pending += 1
            if pending >= 200:  # a few hundred rows per write, not one tiny write per row
                yield flush()
                pending = 0
        if pending:
            yield flush()

    filename = f"{name}-{now.strftime('%Y%m%dT%H%M%SZ')}.csv"
    return Response(
        stream_with_context(lines()),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        direct_passthrough=True,
    )


def _audit_download(name: str, now: datetime) -> None:
    """A download of a list is a copy of customer data (emails, amounts) leaving the console: it is
    recorded like an action (`export_csv`, the list's address with its filters as the target),
    though a GET changes nothing. In its own transaction, before the rows are read; a failure to
    write it is logged, never a failed download (as audit.record_action does for actions)."""
    try:
        db.session.rollback()
        db.session.add(
            OperatorAction(
                operator=getattr(current_user, "email", "?"),
                action="export_csv",
                target=request.full_path.rstrip("?")[:200],
                status=200,
                outcome=f"downloaded the {name.replace('-', ' ')} list as CSV",
                created_at=now,
            )
        )
        db.session.commit()
    except Exception:
        db.session.rollback()
        log.error("could not write the audit row of the download %s", request.full_path, exc_info=True)


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
