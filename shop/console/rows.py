"""One row of each kind as the console shows it, in the JSON shape of docs/REFERENCE.md, Console:
an order in a list, a delivery, a scheduled command, a restore warning, a webhook receipt, a
refund, a sweep cycle. The lists (queries.py) and one order's timeline (timeline.py) share them."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from flask import current_app
from sqlalchemy import func, select

from ..domain.deadlines import FAILURE_PROVIDER, as_utc
from ..domain.order import LIVE, OrderStatus
from ..domain.refunds import NOT_RETURNED, PaidAndRefunded, RefundStatus, charged_for, needs_operator, paid_and_refunded
from ..domain.timestamps import iso
from ..extensions import db
from ..models import (
    Order,
    OutboxDelivery,
    ReconciliationCycle,
    Refund,
    RestoreWarning,
    ScheduledCommand,
    WebhookReceipt,
    WorkStatus,
)
from ..web.requests import work_ref
from . import sweep_words

# The outbox list's filter for the pending rows that are waiting for an unavailable provider
# (retried for as long as it takes, never dead-lettered for it).
WAITING = "waiting"
# The live states as stored, for the queries that select them.
# Refunds whose money did not go back and that nobody has dealt with (the dashboard's count).
REFUND_NEEDS_OPERATOR = [Refund.status.in_(NOT_RETURNED), Refund.settled_at.is_(None)]


def waiting_for_provider(row) -> bool:
    return row.status == WorkStatus.PENDING and row.failure_kind == FAILURE_PROVIDER


def age_seconds(now: datetime, then: datetime | None) -> int | None:
    if then is None:
        return None
    return max(0, int((now - as_utc(then)).total_seconds()))


def refunded_by_order(order_ids: list[int]) -> dict[int, int]:
    """The sum of each order's succeeded refunds (a page of the orders list: one query)."""
    if not order_ids:
        return {}
    rows = db.session.execute(
        select(Refund.order_id, func.sum(Refund.amount))
        .where(Refund.order_id.in_(order_ids), Refund.status == RefundStatus.SUCCEEDED)
        .group_by(Refund.order_id)
    ).all()
    return {order_id: int(total or 0) for order_id, total in rows}


def money_back(order: Order, refunded: int) -> PaidAndRefunded | None:
    """How much of a paid order's payment went back (None unless Paid)."""
    if order.status is not OrderStatus.PAID:
        return None
    return paid_and_refunded(charged_for(order.total, order.charged), refunded)


def order_row(order: Order, now: datetime, cutoff: datetime, refunded: int = 0) -> dict:
    return {
        "reference": order.reference,
        "status": order.status,
        "total": order.total,
        "currency": order.currency,
        "email": order.email,
        "payment_attempts": order.payment_attempts,
        "inventory_restored": bool(order.inventory_restored),
        "refunded": refunded,
        "net": charged_for(order.total, order.charged) - refunded,
        "money_back": money_back(order, refunded),
        "stuck": order.status in LIVE and as_utc(order.updated_at) < cutoff,
        "age_seconds": age_seconds(now, order.updated_at),
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
    }


def delivery_json(delivery: OutboxDelivery, event_name: str | None, reference: str | None) -> dict:
    """The outbox item of docs/REFERENCE.md, Console: the contract's keys, plus whether the row is
    waiting for the provider (its status then stays "pending")."""
    return {
        "id": delivery.id,
        "event": event_name,
        "handler": delivery.handler,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "last_error": delivery.last_error,
        "order_reference": reference,
        "waiting_for_provider": waiting_for_provider(delivery),
    }


def delivery_detail(delivery: OutboxDelivery, event_name, reference, now) -> dict:
    return {
        **delivery_json(delivery, event_name, reference),
        "max_attempts": delivery.max_attempts,
        "traceback": delivery.last_traceback,
        "discard_reason": delivery.discard_reason,
        "created_at": iso(delivery.created_at),
        "updated_at": iso(delivery.updated_at),
        "next_attempt_at": iso(delivery.next_attempt_at),
        "completed_at": iso(delivery.completed_at),
        "age_seconds": age_seconds(now, delivery.created_at),
    }


def command_json(command: ScheduledCommand, reference: str | None, now: datetime) -> dict:
    return {
        "id": command.id,
        "kind": command.kind,
        "status": command.status,
        "attempts": command.attempts,
        "max_attempts": command.max_attempts,
        "last_error": command.last_error,
        "order_reference": reference,
        "waiting_for_provider": waiting_for_provider(command),
        "provider_waits": command.provider_waits,
        "due_at": iso(command.next_attempt_at),
        "completed_at": iso(command.completed_at),
        "discard_reason": command.discard_reason,
        "created_at": iso(command.created_at),
        "age_seconds": age_seconds(now, command.created_at),
    }


def command_item(command: ScheduledCommand, reference: str | None) -> dict:
    """A scheduled command (a deadline, a refund, an email) in the outbox list's documented shape:
    its handler is its kind, it delivers no event, and its id is "cmd-<n>" because commands and
    deliveries are numbered apart; `/console/outbox/cmd-<n>/retry` acts on it."""
    return {
        "id": work_ref("command", command.id),
        "event": None,
        "handler": command.kind,
        "status": command.status,
        "attempts": command.attempts,
        "last_error": command.last_error,
        "order_reference": reference,
        "waiting_for_provider": waiting_for_provider(command),
    }


def warning_json(warning: RestoreWarning, reference: str | None) -> dict:
    """docs/REFERENCE.md, Console: exactly these keys."""
    return {
        "id": warning.id,
        "order_reference": reference,
        "variant_id": warning.variant_id,
        "quantity": warning.quantity,
        "reason": warning.reason,
        "state": warning.state,
    }


def warning_detail(warning: RestoreWarning, reference, now) -> dict:
    return {
        **warning_json(warning, reference),
        "resolution": warning.resolution,
        "created_at": iso(warning.created_at),
        "resolved_at": iso(warning.resolved_at),
        "age_seconds": age_seconds(now, warning.created_at),
    }


def receipt_json(receipt: WebhookReceipt, reference: str | None) -> dict:
    return {
        "id": receipt.id,
        "event_id": receipt.event_id,
        "event_type": receipt.event_type,
        "outcome": receipt.outcome,
        "reason": receipt.reason,
        "http_status": receipt.http_status,
        "order_reference": reference,
        "received_at": iso(receipt.received_at),
        "source_address": receipt.source_address,
        "signed": receipt.signed,
    }


def refund_json(refund: Refund, reference: str | None, now: datetime) -> dict:
    """A refund as the console shows it: the provider's status and its id, the attempts made, why
    the last one failed, and whether (and how) an operator settled it outside the shop."""
    return {
        "id": refund.id,
        "order_reference": reference,
        "amount": refund.amount,
        "currency": refund.currency,
        "status": refund.status,
        "reason": refund.reason,
        "session_id": refund.session_id,
        "provider_refund_id": refund.provider_refund_id,
        "attempts": refund.attempts,
        "failure_reason": refund.failure_reason,
        "failed_at": iso(refund.failed_at),
        "last_error": refund.last_error,
        # The column holds a RefundStatus's spelling (a str); needs_operator only compares it.
        "needs_operator": needs_operator(cast(RefundStatus, refund.status), refund.settled_at is not None),
        "settled_at": iso(refund.settled_at),
        "settled_by": refund.settled_by,
        "settlement_reason": refund.settlement_reason,
        "requested_by": refund.requested_by,
        "restock": refund.restock,
        "created_at": iso(refund.created_at),
        "updated_at": iso(refund.updated_at),
        "age_seconds": age_seconds(now, refund.created_at),
    }


def sweep_json(cycle: ReconciliationCycle, now: datetime, problems: list | None = None) -> dict:
    """docs/REFERENCE.md, Console: the recorded cycle, plus its outcome in words ("ok" only when
    nothing went wrong) and its errors as `problems` an operator can act on."""
    duration = None
    if cycle.finished_at is not None:
        duration = round((as_utc(cycle.finished_at) - as_utc(cycle.started_at)).total_seconds(), 3)
    if problems is None:
        problems = sweep_problems([cycle], now).get(cycle.id, [])
    code, words = sweep_words.outcome(cycle.status, len(cycle.errors or []))
    return {
        "id": cycle.id,
        "status": cycle.status,
        "started_at": iso(cycle.started_at),
        "finished_at": iso(cycle.finished_at),
        "duration_seconds": duration,
        "cutoff": iso(cycle.cutoff),
        "expiry_counts": cycle.expiry_counts or {},
        "provider_counts": cycle.provider_counts or {},
        "errors": cycle.errors or [],
        "notes": cycle.notes or [],
        "holder": cycle.holder,
        "age_seconds": age_seconds(now, cycle.started_at),
        "outcome": code,
        "outcome_words": words,
        "problems": problems,
    }


def sweep_problems(cycles: list, now: datetime) -> dict:
    """The cycles' errors in words, with the orders they name read in one query."""
    ids = {e.get("order_id") for c in cycles for e in (c.errors or []) if isinstance(e, dict)}
    ids = [i for i in ids if isinstance(i, int)]
    orders = {}
    if ids:
        orders = {
            o.id: o
            for o in db.session.execute(
                select(
                    Order.id, Order.reference, Order.status, Order.provider_next_check_at, Order.late_money_watch_since
                ).where(Order.id.in_(ids))
            ).all()
        }
    latest = db.session.execute(select(func.max(ReconciliationCycle.started_at))).scalar()
    interval = current_app.config["RECONCILIATION_INTERVAL_SECONDS"]
    return sweep_words.problems_by_cycle(cycles, orders, now, sweep_words.next_cycle(latest, interval))
