"""Everything that happened to one order, for the console's order page: each kind of row in its
own list, and one merged, time-ordered list in words to read top to bottom."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, overload

from sqlalchemy import select

from ..domain.deadlines import as_utc
from ..domain.order import LIVE, OrderStatus
from ..domain.refunds import RefundStatus
from ..domain.timestamps import iso
from ..extensions import db
from ..models import (
    CommandKind,
    OperatorAction,
    Order,
    OutboxDelivery,
    OutboxEvent,
    PaymentProofRefusal,
    ProviderRefusal,
    PrunedDetail,
    Refund,
    RefusalKind,
    RestoreWarning,
    ScheduledCommand,
    WebhookReceipt,
    WorkStatus,
)
from ..provider.links import session_link
from ..saga.operator_refunds import refundable_now
from ..scheduling.stuck import stuck_cutoff
from ..web.serialize import OrderView
from .audit import action_json
from .format import human_money, human_time
from .rows import (
    WAITING,
    age_seconds,
    command_json,
    delivery_detail,
    receipt_json,
    refund_json,
    waiting_for_provider,
    warning_detail,
)
from .words import (
    action_words,
    command_words,
    event_words,
    handler_words,
    receipt_words,
    webhook_event_words,
    work_words,
)


@dataclass
class _OrderRows:
    """Every row that names one order, each kind oldest first (one query per kind)."""

    events: Sequence[OutboxEvent]
    receipts: Sequence[WebhookReceipt]
    deliveries: Sequence[OutboxDelivery]
    commands: Sequence[ScheduledCommand]
    warnings: Sequence[RestoreWarning]
    refunds: Sequence[Refund]
    refusals: Sequence[PaymentProofRefusal]
    provider_refusals: Sequence[ProviderRefusal]
    actions: Sequence[OperatorAction]


def _rows_of(order: Order) -> _OrderRows:
    session = db.session

    def of(model: Any, *order_by: Any) -> Sequence[Any]:
        return session.execute(select(model).where(model.order_id == order.id).order_by(*order_by)).scalars().all()

    return _OrderRows(
        events=of(OutboxEvent, OutboxEvent.created_at, OutboxEvent.id),
        receipts=of(WebhookReceipt, WebhookReceipt.received_at, WebhookReceipt.id),
        deliveries=of(OutboxDelivery, OutboxDelivery.id),
        commands=of(ScheduledCommand, ScheduledCommand.id),
        warnings=of(RestoreWarning, RestoreWarning.id),
        refunds=list(order.refunds),  # the relationship the order's view reads too (ordered by id): one query for both
        refusals=of(PaymentProofRefusal, PaymentProofRefusal.id),
        provider_refusals=of(ProviderRefusal, ProviderRefusal.id),
        actions=of(OperatorAction, OperatorAction.id),
    )


@dataclass(frozen=True)
class _Say:
    """How the merged timeline names events, handlers, command kinds, work statuses and webhook
    outcomes: by their codes (the JSON) or in words (the page)."""

    event: Callable[[str], str]
    handler: Callable[[str], str]
    command: Callable[[str], str]
    work: Callable[[str], str]
    receipt: Callable[[str], str]
    webhook: Callable[[str], str]  # a webhook's event type
    action: Callable[[str], str]  # an operator's audited action
    armed: str  # "{} armed": a command written
    retired: str  # a command its order moved past


CODES = _Say(str, str, str, str, str, str, str, "{} armed", "{} retired")
WORDS = _Say(
    event_words,
    handler_words,
    command_words,
    work_words,
    receipt_words,
    webhook_event_words,
    action_words,
    "{} scheduled",
    "{}: no longer needed",
)


def order_page(order: Order, now: datetime) -> tuple[dict, dict]:
    """The console's order page: its data (the JSON too) and what only the HTML shows: the
    timeline in words, the order's money summary and whether a ship is capturing its hold (no
    cancel, no second ship to offer meanwhile)."""
    rows = _rows_of(order)
    data = order_timeline(order, now, rows)
    names = {e.id: e.name for e in rows.events}
    shown = _merged(rows, names, db.session.get(PrunedDetail, order.id), WORDS)
    capturing = order.status == OrderStatus.AUTHORIZED and order.capture_requested_at is not None  # not yet Paid
    return data, {"timeline_words": shown, "money_summary": OrderView.of(order).money, "capturing": capturing}


def order_timeline(order: Order, now: datetime, rows: _OrderRows | None = None) -> dict:
    """Everything that happened to one order, each kind in its own list, plus one merged,
    time-ordered list for reading top to bottom."""
    view = OrderView.of(order)
    ref = view.reference
    rows = rows or _rows_of(order)
    names = {e.id: e.name for e in rows.events}
    data = {
        "order": _order_summary(view, now),
        "transitions": [
            {"id": e.id, "event": e.name, "at": iso(e.created_at), "payload": e.payload} for e in rows.events
        ],
        "webhooks": [receipt_json(r, ref) for r in rows.receipts],
        "deliveries": [delivery_detail(d, names.get(d.event_id), ref, now) for d in rows.deliveries],
        "commands": [command_json(c, ref, now) for c in rows.commands],
        "restore_warnings": [warning_detail(w, ref, now) for w in rows.warnings],
        "refunds": [
            {
                **refund_json(r, ref, now),
                "command_status": _refund_command(r, rows.commands),
                "waiting_for_provider": _refund_command(r, rows.commands) == WAITING,
            }
            for r in rows.refunds
        ],
        "proof_refusals": [
            {
                "id": p.id,
                "session_id": p.session_id,
                "source": p.source,
                "problems": p.problems,
                "amount_total": p.amount_total,
                "currency": p.currency,
                "created_at": iso(p.created_at),
            }
            for p in rows.refusals
        ],
        "provider_refusals": [
            {
                "id": p.id,
                "attempt": p.attempt,
                "kind": p.kind,
                "code": p.code,
                "reason": p.reason,
                "created_at": iso(p.created_at),
            }
            for p in rows.provider_refusals
        ],
        "operator_actions": [action_json(a, ref) for a in rows.actions],
    }
    pruned = db.session.get(PrunedDetail, order.id)
    data["pruned"] = _pruned(pruned)
    data["provider_session_link"] = session_link(view.payment_session_id, view.payment_session_url)
    data["timeline"] = _merged(rows, names, pruned)
    return data


@overload
def _pruned(row: PrunedDetail) -> dict: ...
@overload
def _pruned(row: None) -> None: ...
def _pruned(row: PrunedDetail | None) -> dict | None:
    """What the prune removed of this order's detail (shop.scheduling.retention), in numbers and
    in words; None when nothing was. Its transitions are never pruned."""
    if row is None:
        return None
    counts = {
        "deliveries": row.deliveries,
        "commands": row.commands,
        "webhook_receipts": row.webhook_receipts,
        "operator_actions": row.operator_actions,
    }
    words = {
        "deliveries": "event deliveries",
        "commands": "scheduled commands",
        "webhook_receipts": "webhook receipts",
        "operator_actions": "operator actions",
    }
    removed = ", ".join(f"{n} {words[k]}" for k, n in counts.items() if n)
    return {
        **counts,
        "first_pruned_at": iso(row.first_pruned_at),
        "last_pruned_at": iso(row.last_pruned_at),
        "removed": removed,
        "words": (
            f"Older detail of this order was pruned by the retention rules ({removed}; last on "
            f"{human_time(row.last_pruned_at)}). Its transitions, lines, refunds and warnings are all kept, "
            "so the timeline still shows everything that happened to it; the pruned rows were finished work "
            "and receipts past RETENTION_DAYS (audit past AUDIT_RETENTION_DAYS)."
        ),
    }


def _order_summary(order: OrderView, now: datetime) -> dict:
    status = order.status
    return {
        **order.json(),
        "email": order.email,
        "payment_attempts": order.payment_attempts,
        # A paid order's earlier failure is history (the timeline keeps it), not a problem.
        "last_payment_error": None if status is OrderStatus.PAID else order.last_payment_error,
        "age_seconds": age_seconds(now, order.updated_at),
        "stuck": status in LIVE and as_utc(order.updated_at) < stuck_cutoff(now),
        # Set when the sweep's provider pass backs off an order whose answer cannot
        # change soon: until then the sweep does not ask the provider about it.
        "provider_next_check_at": _future_iso(order.provider_next_check_at, now),
        "provider_next_check_in_seconds": _seconds_until(order.provider_next_check_at, now),
        # Money may still come for this cancelled order's session, or its refund has not
        # gone through yet: the sweep keeps asking (sweep.check_cancelled_payment).
        "watched_for_late_money": status is OrderStatus.CANCELLED and order.late_money_watch_since is not None,
        # A paid order's money: how much went back (`paid`, `partially_refunded`, `refunded`), what
        # the customer paid net, and what is left to refund (None unless Paid).
        "money_back": order.money.money_back,
        "net": order.money.net,
        "refundable": refundable_now(order.id),
    }


def _merged(rows: _OrderRows, names: dict, pruned: PrunedDetail | None = None, say: _Say = CODES) -> list[dict]:
    """All of it in one list, oldest first: (at, kind, what, detail)."""
    merged = (
        [(e.created_at, "transition", say.event(e.name), _payload_words(e.payload)) for e in rows.events]
        + [
            (
                r.received_at,
                "webhook",
                f"{say.webhook(r.event_type or 'webhook')}: {say.receipt(r.outcome)}",
                r.reason or "",
            )
            for r in rows.receipts
        ]
        + [
            (
                c.created_at,
                "command",
                say.armed.format(say.command(c.kind)),
                f"due {human_time(c.next_attempt_at)}, now "
                + ("waiting for the provider" if waiting_for_provider(c) else say.work(c.status)),
            )
            for c in rows.commands
        ]
        + [
            (
                c.completed_at or c.updated_at,
                "command",
                say.retired.format(say.command(c.kind)),
                c.discard_reason or say.work(WorkStatus.OBSOLETE),
            )
            for c in rows.commands
            if c.status == WorkStatus.OBSOLETE
        ]
        + [
            (
                d.completed_at or d.updated_at,
                "delivery",
                f"{say.handler(d.handler)}: {say.work(d.status)}",
                f"{say.event(names.get(d.event_id, '?'))}, {d.attempts} attempt(s)"
                + (f", {d.last_error}" if d.last_error else ""),
            )
            for d in rows.deliveries
            if d.status in (WorkStatus.DONE, WorkStatus.DEAD, WorkStatus.DISCARDED)
        ]
        + [(w.created_at, "restore_warning", "restore warning", w.reason) for w in rows.warnings]
        + [item for r in rows.refunds for item in _refund_timeline(r)]
        + [(p.created_at, "proof_refused", "payment proof refused", p.problems) for p in rows.refusals]
        + [
            (
                p.created_at,
                "provider_refused" if p.kind == RefusalKind.REFUSED else "payment_start_failed",
                f"provider refused payment attempt {p.attempt}"
                if p.kind == RefusalKind.REFUSED
                else f"payment attempt {p.attempt} did not start: provider unavailable",
                p.reason + (f" (code {p.code})" if p.code else ""),
            )
            for p in rows.provider_refusals
        ]
        + [
            (
                a.created_at,
                "operator",
                f"{say.action(a.action)} by {a.operator}",
                a.outcome + (f" Reason: {a.reason}" if a.reason else ""),
            )
            for a in rows.actions
        ]
    )
    if pruned is not None:
        removed = _pruned(pruned)["removed"]
        merged.append((pruned.last_pruned_at, "pruned", "older detail pruned", f"{removed} removed; transitions kept"))
    merged.sort(key=lambda item: as_utc(item[0]))
    return [{"at": iso(at), "kind": kind, "what": what, "detail": detail} for at, kind, what, detail in merged]


def _refund_timeline(refund: Refund) -> list[tuple]:
    """A refund's moments on the order's timeline: made, failed (the last failure), succeeded,
    settled outside the shop."""
    money = human_money(refund.amount, refund.currency)
    if refund.requested_by:  # an operator's refund of a paid order
        stock = ", stock put back" if refund.restock else ""
        items = [(refund.created_at, "refund", f"refund by {refund.requested_by}", f"{money}: {refund.reason}{stock}")]
    else:
        items = [(refund.created_at, "refund", "refund created", f"{money}: {refund.reason}")]
    if refund.failed_at is not None:
        items.append(
            (
                refund.failed_at,
                "refund",
                "refund failed at the provider",
                refund.last_error or refund.failure_reason or "",
            )
        )
    if refund.status == RefundStatus.SUCCEEDED:
        items.append(
            (
                refund.updated_at,
                "refund",
                "refund succeeded",
                f"{money} back to the customer (attempt {refund.attempts}, {refund.provider_refund_id})",
            )
        )
    elif refund.status == WorkStatus.PENDING and refund.attempts > 1:
        items.append(
            (refund.updated_at, "refund", f"refund sent again (attempt {refund.attempts})", "pending at the provider")
        )
    if refund.settled_at is not None:
        items.append(
            (
                refund.settled_at,
                "refund",
                "refund settled outside the shop",
                f"by {refund.settled_by}: {refund.settlement_reason}",
            )
        )
    return items


def _refund_command(refund: Refund, commands) -> str | None:
    """Where the refund's command stands: pending, waiting (for the provider), dead, done..."""
    for command in commands:
        if command.kind == CommandKind.REFUND_PAYMENT and (command.payload or {}).get("refund_id") == refund.id:
            return WAITING if waiting_for_provider(command) else command.status
    return None


def _seconds_until(at: datetime | None, now: datetime) -> int | None:
    return int((as_utc(at) - now).total_seconds()) if at is not None and as_utc(at) > now else None


def _future_iso(at: datetime | None, now: datetime) -> str | None:
    """A time still ahead, as ISO; a past one says nothing any more (the sweep may ask again)."""
    return iso(at) if at is not None and as_utc(at) > now else None


def _payload_words(payload: dict) -> str:
    payload = dict(payload or {})
    currency = payload.pop("currency", None)
    words = []
    for key, value in payload.items():
        if key in ("order_id", "reference") or value in (None, ""):
            continue
        if key in ("total", "amount") and isinstance(value, int) and currency:
            value = human_money(value, currency)
        words.append(f"{key}: {value}")
    return ", ".join(words)
