"""What the console shows, read straight from the tables (the database is the truth). Each
function returns plain dicts: the JSON answer, and what the HTML page renders."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from flask import current_app
from sqlalchemy import and_, func, or_, select, union_all

from ..domain.deadlines import FAILURE_PROVIDER, as_utc
from ..domain.order import LIVE_STATUSES
from ..domain.refunds import NOT_RETURNED, needs_operator
from ..extensions import db
from ..models import (
    OperatorAction,
    Order,
    OutboxDelivery,
    OutboxEvent,
    PaymentProofRefusal,
    ProviderRefusal,
    ReconciliationCycle,
    Refund,
    RestoreWarning,
    ScheduledCommand,
    WebhookReceipt,
)
from ..ops.health import snapshot
from ..orders.serialize import iso, order_json
from ..payments import guard
from ..scheduling.stuck import stuck_cutoff
from ..web import work_ref
from . import sweep_words
from .audit import action_json
from .format import human_money, human_time

PER_PAGE = 100
# obsolete: a deadline retired because its order reached a final state first (scheduled commands only).
WORK_STATUSES = ("pending", "processing", "done", "dead", "discarded", "obsolete")
# The outbox list's filters: the statuses, plus the pending rows that are waiting for an
# unavailable provider (retried for as long as it takes, never dead-lettered for it).
WAITING = "waiting"
WORK_FILTERS = WORK_STATUSES + (WAITING,)


def waiting_for_provider(row) -> bool:
    return row.status == "pending" and row.failure_kind == FAILURE_PROVIDER


WARNING_STATES = ("open", "resolved", "duplicate")
WEBHOOK_OUTCOMES = ("accepted", "duplicate", "ignored", "rejected", "failed")  # see shop.webhooks


def age_seconds(now: datetime, then: datetime | None) -> int | None:
    if then is None:
        return None
    return max(0, int((now - as_utc(then)).total_seconds()))


# A list counts its rows up to this many past the current page: exact below it, "10,000+" above. An exact
# COUNT(*) of an unfiltered list reads every row (a second or more at a million orders) for a
# number nobody pages through.
COUNT_CAP = 10_000


def paging(query, page: int, per_page: int = PER_PAGE, count_query=None):
    """(rows, meta) for one page of a select; `page` counts from 1. `total` is exact unless
    `total_capped`, when there are at least that many (and a next page whenever there is one).
    `count_query` counts the rows when `query` only holds enough of them for this page."""
    limit = page * per_page + COUNT_CAP
    counted = db.session.execute(
        select(func.count()).select_from(
            (count_query if count_query is not None else query).order_by(None).limit(limit + 1).subquery()
        )
    ).scalar_one()
    rows = db.session.execute(query.limit(per_page).offset((page - 1) * per_page)).all()
    meta = {
        "page": page,
        "per_page": per_page,
        "total": min(counted, limit),
        "total_capped": counted > limit,
        "next_page": page + 1 if page * per_page < counted else None,
    }
    return rows, meta


# -- dashboard ------------------------------------------------------------------------------


def _count_and_oldest(query_from, where, column, now):
    count, oldest = db.session.execute(
        select(func.count(), func.min(column)).select_from(query_from).where(*where)
    ).one()
    return {"count": count, "oldest_age_seconds": age_seconds(now, oldest)}


def dashboard(now: datetime) -> dict:
    cutoff = stuck_cutoff(now)
    per_status = {
        status: (count, oldest)
        for status, count, oldest in db.session.execute(
            select(Order.status, func.count(), func.min(Order.updated_at))
            .where(Order.status.in_(LIVE_STATUSES), Order.updated_at < cutoff)
            .group_by(Order.status)
        ).all()
    }
    by_status = {
        s: {
            "count": per_status.get(s, (0, None))[0],
            "oldest_age_seconds": age_seconds(now, per_status.get(s, (0, None))[1]),
        }
        for s in LIVE_STATUSES
    }
    oldest_stuck = min((o for _, o in per_status.values() if o is not None), default=None, key=as_utc)
    stuck = {
        "count": sum(v["count"] for v in by_status.values()),
        "oldest_age_seconds": age_seconds(now, oldest_stuck),
        "stuck_after_seconds": int((now - cutoff).total_seconds()),
        "by_status": by_status,
    }

    # A dead letter's age counts from when its work was created: how long it has gone undone.
    deliveries = _count_and_oldest(OutboxDelivery, [OutboxDelivery.status == "dead"], OutboxDelivery.created_at, now)
    commands = _count_and_oldest(
        ScheduledCommand, [ScheduledCommand.status == "dead"], ScheduledCommand.created_at, now
    )
    ages = [a for a in (deliveries["oldest_age_seconds"], commands["oldest_age_seconds"]) if a is not None]
    dead = {
        "count": deliveries["count"] + commands["count"],
        "oldest_age_seconds": max(ages) if ages else None,
        "deliveries": deliveries,
        "commands": commands,
    }

    warnings = _count_and_oldest(RestoreWarning, [RestoreWarning.state == "open"], RestoreWarning.created_at, now)
    # Refunds whose money did not go back and that nobody has dealt with: aged from the failure.
    failed_refunds = _count_and_oldest(Refund, REFUND_NEEDS_OPERATOR, Refund.failed_at, now)

    cycle = db.session.execute(
        select(ReconciliationCycle)
        .order_by(ReconciliationCycle.started_at.desc(), ReconciliationCycle.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    last_ok = db.session.execute(
        select(func.max(ReconciliationCycle.finished_at)).where(ReconciliationCycle.status == "ok")
    ).scalar()
    return {
        "now": iso(now),
        "stuck_orders": stuck,
        "dead_letters": dead,
        "restore_warnings": warnings,
        "refunds_failed": failed_refunds["count"],
        "refunds_failed_oldest_age_seconds": failed_refunds["oldest_age_seconds"],
        "last_sweep": sweep_json(cycle, now) if cycle else None,
        "last_successful_sweep_at": iso(as_utc(last_ok)) if last_ok else None,
        "provider": provider_state(now),
    }


REFUND_NEEDS_OPERATOR = [Refund.status.in_(NOT_RETURNED), Refund.settled_at.is_(None)]


def provider_state(now: datetime) -> dict:
    """The payment provider as the circuit breaker sees it (payments.guard), in words."""
    view = guard.get().breaker_view()
    state, failures = view["state"], int(view.get("failures") or 0)
    opened = view["opened_at"] if state != guard.CLOSED and view["opened_at"] else None
    words = guard.STATE_WORDS.get(state, state)
    if state == guard.CLOSED and failures:
        # Closed, but the latest calls failed: not "reachable" until one succeeds.
        threshold = current_app.config["STRIPE_BREAKER_THRESHOLD"]
        words = (
            f"Failing: the last {failures} call(s) to the provider failed in a row (after {threshold} it "
            "stops calling for a while); checkout takes orders and customers pay later with “Pay now”."
        )
    return {
        "state": state,
        "failures": failures,
        "words": words,
        "since_seconds": max(0, int(now.timestamp() - opened)) if opened else None,
        "shared": view["shared"],
    }


def liveness(now: datetime) -> dict:
    """Processes with their heartbeat ages, queues with depth and the age of their oldest due
    item, the next sweep, and the same verdict /healthz gives (shop.ops.health)."""
    found = snapshot(now, with_queues=True)
    processes = [
        {
            "role": p["role"],
            "name": p["name"],
            "host": p["host"],
            "pid": p["pid"],
            "runs": p["runs"],
            "state": "stalled" if p["stalled"] else p["state"],
            "stalled": p["stalled"],
            "beat_age_seconds": p["beat_age_seconds"],
            "last_beat_at": iso(p["last_beat"]),
            "since": iso(p["since"]),
            "job": p["job"],
            "job_since": iso(p["job_since"]),
            "last_job": p["last_job"],
            "last_job_at": iso(p["last_job_at"]),
            "in_redis": p["in_redis"],
        }
        for p in sorted(found["processes"], key=lambda p: (p["role"] != "worker", p["name"]))
    ]
    queues = [{**q, "oldest_age_seconds": _whole(q["oldest_age_seconds"])} for q in found["queues"] or ()]
    for kind, model in (("outbox deliveries", OutboxDelivery), ("scheduled commands", ScheduledCommand)):
        count, oldest = db.session.execute(
            select(func.count(), func.min(model.next_attempt_at)).where(
                model.status == "pending", model.next_attempt_at <= now
            )
        ).one()
        queues.append(
            {
                "name": kind,
                "kind": "database",
                "depth": count,
                "due": count,
                "oldest_age_seconds": age_seconds(now, oldest),
            }
        )
    return {
        "health": {
            "healthy": found["healthy"],
            "checks": found["checks"],
            "problems": found["problems"],
            "stale_after_seconds": found["stale_seconds"],
            "outbox_lag_limit_seconds": found["outbox_lag_limit_seconds"],
        },
        "processes": processes,
        "queues": queues,
        "next_sweep_at": iso(found["next_sweep_at"]),
    }


def _whole(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds)


# -- orders ---------------------------------------------------------------------------------


def order_row(order: Order, now: datetime, cutoff: datetime) -> dict:
    return {
        "reference": order.reference,
        "status": order.status,
        "total": order.total,
        "currency": order.currency,
        "email": order.email,
        "payment_attempts": order.payment_attempts,
        "inventory_restored": bool(order.inventory_restored),
        "stuck": order.status in LIVE_STATUSES and as_utc(order.updated_at) < cutoff,
        "age_seconds": age_seconds(now, order.updated_at),
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
    }


def orders(now: datetime, *, stuck: bool, statuses: list[str], page: int, q: str = "") -> dict:
    """Newest first (new orders on the first page); with `stuck`, the longest waiting first.
    `q` finds an order by its reference, its customer's email (any case) or its provider
    session id: each an exact match on an index, so a search costs the same at a million orders."""
    cutoff = stuck_cutoff(now)
    query = select(Order)
    if statuses:
        query = query.where(Order.status.in_(statuses))
    if q:
        query = query.where(
            or_(Order.reference == q.upper(), func.lower(Order.email) == q.lower(), Order.payment_session_id == q)
        )
    if stuck:
        counted = query.where(Order.status.in_(LIVE_STATUSES), Order.updated_at < cutoff)
        wanted = [s for s in LIVE_STATUSES if not statuses or s in statuses]
        if wanted:
            rows, meta = paging(_longest_waiting(query, wanted, cutoff, page * PER_PAGE), page, count_query=counted)
        else:  # only final states asked for: none of them is ever stuck
            rows, meta = paging(counted.order_by(Order.id), page)
    else:
        rows, meta = paging(query.order_by(Order.id.desc()), page)
    return {
        "orders": [order_row(o, now, cutoff) for (o,) in rows],
        "filters": {"stuck": stuck, "status": statuses, "q": q},
        **meta,
    }


def _longest_waiting(query, statuses, cutoff: datetime, n: int):
    """The first `n` stuck orders, longest waiting first, as one range scan of
    ix_orders_status_updated_at per status merged (as the sweep selects): over an IN list
    PostgreSQL fetched and sorted every stuck row, in parallel workers, for each page."""
    parts = []
    for status in statuses:
        inner = (
            query.with_only_columns(Order.id, Order.updated_at)
            .where(Order.status == status, Order.updated_at < cutoff)
            .order_by(Order.updated_at, Order.id)
            .limit(n)
            .subquery()
        )
        parts.append(select(inner.c.id, inner.c.updated_at))
    first = union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()
    return select(Order).join(first, first.c.id == Order.id).order_by(first.c.updated_at, first.c.id)


def audit(*, page: int, operator: str = "", order: Order | None = None) -> dict:
    """Operator actions, newest first."""
    query = select(OperatorAction, Order.reference).outerjoin(Order, Order.id == OperatorAction.order_id)
    if operator:
        query = query.where(func.lower(OperatorAction.operator) == operator.lower())
    if order is not None:
        query = query.where(OperatorAction.order_id == order.id)
    query = query.order_by(OperatorAction.id.desc())
    rows, meta = paging(query, page)
    return {"actions": [action_json(a, ref) for a, ref in rows], "filters": {"operator": operator}, **meta}


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
    }


@dataclass
class _OrderRows:
    """Every row that names one order, each kind oldest first (one query per kind)."""

    events: list
    receipts: list
    deliveries: list
    commands: list
    warnings: list
    refunds: list
    refusals: list
    provider_refusals: list
    actions: list


def _rows_of(order: Order) -> _OrderRows:
    session = db.session

    def of(model, *order_by):
        return session.execute(select(model).where(model.order_id == order.id).order_by(*order_by)).scalars().all()

    return _OrderRows(
        events=of(OutboxEvent, OutboxEvent.created_at, OutboxEvent.id),
        receipts=of(WebhookReceipt, WebhookReceipt.received_at, WebhookReceipt.id),
        deliveries=of(OutboxDelivery, OutboxDelivery.id),
        commands=of(ScheduledCommand, ScheduledCommand.id),
        warnings=of(RestoreWarning, RestoreWarning.id),
        refunds=list(order.refunds),  # the relationship order_json reads too (ordered by id): one query for both
        refusals=of(PaymentProofRefusal, PaymentProofRefusal.id),
        provider_refusals=of(ProviderRefusal, ProviderRefusal.id),
        actions=of(OperatorAction, OperatorAction.id),
    )


def order_timeline(order: Order, now: datetime) -> dict:
    """Everything that happened to one order, each kind in its own list, plus one merged,
    time-ordered list for reading top to bottom."""
    ref = order.reference
    rows = _rows_of(order)
    names = {e.id: e.name for e in rows.events}
    data = {
        "order": _order_summary(order, now),
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
            {"id": p.id, "attempt": p.attempt, "code": p.code, "reason": p.reason, "created_at": iso(p.created_at)}
            for p in rows.provider_refusals
        ],
        "operator_actions": [action_json(a, ref) for a in rows.actions],
    }
    data["timeline"] = _merged(rows, names)
    return data


def _order_summary(order: Order, now: datetime) -> dict:
    return {
        **order_json(order),
        "email": order.email,
        "payment_attempts": order.payment_attempts,
        # A paid order's earlier failure is history (the timeline keeps it), not a problem.
        "last_payment_error": None if order.status == "Paid" else order.last_payment_error,
        "age_seconds": age_seconds(now, order.updated_at),
        "stuck": order.status in LIVE_STATUSES and as_utc(order.updated_at) < stuck_cutoff(now),
        # Set when the sweep's provider pass backs off an order whose answer cannot
        # change soon: until then the sweep does not ask the provider about it.
        "provider_next_check_at": _future_iso(order.provider_next_check_at, now),
        "provider_next_check_in_seconds": _seconds_until(order.provider_next_check_at, now),
        # Money may still come for this cancelled order's session, or its refund has not
        # gone through yet: the sweep keeps asking (sweep.check_cancelled_payment).
        "watched_for_late_money": order.status == "Cancelled" and order.payment_processing_at is not None,
    }


def _merged(rows: _OrderRows, names: dict) -> list[dict]:
    """All of it in one list, oldest first: (at, kind, what, detail)."""
    merged = (
        [(e.created_at, "transition", e.name, _payload_words(e.payload)) for e in rows.events]
        + [
            (r.received_at, "webhook", f"{r.event_type or 'webhook'}: {r.outcome}", r.reason or "")
            for r in rows.receipts
        ]
        + [
            (
                c.created_at,
                "command",
                f"{c.kind} armed",
                f"due {human_time(c.next_attempt_at)}, now "
                + ("waiting for the provider" if waiting_for_provider(c) else c.status),
            )
            for c in rows.commands
        ]
        + [
            (c.completed_at or c.updated_at, "command", f"{c.kind} retired", c.discard_reason or "obsolete")
            for c in rows.commands
            if c.status == "obsolete"
        ]
        + [
            (
                d.completed_at or d.updated_at,
                "delivery",
                f"{d.handler}: {d.status}",
                f"{names.get(d.event_id, '?')}, {d.attempts} attempt(s)"
                + (f", {d.last_error}" if d.last_error else ""),
            )
            for d in rows.deliveries
            if d.status in ("done", "dead", "discarded")
        ]
        + [(w.created_at, "restore_warning", "restore warning", w.reason) for w in rows.warnings]
        + [item for r in rows.refunds for item in _refund_timeline(r)]
        + [(p.created_at, "proof_refused", "payment proof refused", p.problems) for p in rows.refusals]
        + [
            (
                p.created_at,
                "provider_refused",
                f"provider refused payment attempt {p.attempt}",
                p.reason + (f" (code {p.code})" if p.code else ""),
            )
            for p in rows.provider_refusals
        ]
        + [
            (
                a.created_at,
                "operator",
                f"{a.action} by {a.operator}",
                a.outcome + (f" Reason: {a.reason}" if a.reason else ""),
            )
            for a in rows.actions
        ]
    )
    merged.sort(key=lambda item: as_utc(item[0]))
    return [{"at": iso(at), "kind": kind, "what": what, "detail": detail} for at, kind, what, detail in merged]


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
        "needs_operator": needs_operator(refund.status, refund.settled_at is not None),
        "settled_at": iso(refund.settled_at),
        "settled_by": refund.settled_by,
        "settlement_reason": refund.settlement_reason,
        "created_at": iso(refund.created_at),
        "updated_at": iso(refund.updated_at),
        "age_seconds": age_seconds(now, refund.created_at),
    }


def _refund_timeline(refund: Refund) -> list[tuple]:
    """A refund's moments on the order's timeline: made, failed (the last failure), succeeded,
    settled outside the shop."""
    money = human_money(refund.amount, refund.currency)
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
    if refund.status == "succeeded":
        items.append(
            (
                refund.updated_at,
                "refund",
                "refund succeeded",
                f"{money} back to the customer (attempt {refund.attempts}, {refund.provider_refund_id})",
            )
        )
    elif refund.status == "pending" and refund.attempts > 1:
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


REFUND_FILTERS = ("failed", "pending", "succeeded", "settled")


def refunds(now: datetime, *, status: str | None, page: int) -> dict:
    """Refunds, oldest first; `failed`: those whose money did not go back and that no operator
    has settled (what the dashboard counts), `settled`: those an operator settled outside the shop."""
    query = select(Refund, Order.reference).join(Order, Order.id == Refund.order_id).order_by(Refund.id)
    if status == "failed":
        query = query.where(*REFUND_NEEDS_OPERATOR)
    elif status == "settled":
        query = query.where(Refund.settled_at.is_not(None))
    elif status:
        query = query.where(Refund.status == status, Refund.settled_at.is_(None))
    rows, meta = paging(query, page)
    return {"status": status, "refunds": [refund_json(r, ref, now) for r, ref in rows], **meta}


def _refund_command(refund: Refund, commands) -> str | None:
    """Where the refund's command stands: pending, waiting (for the provider), dead, done..."""
    for command in commands:
        if command.kind == "refund_payment" and (command.payload or {}).get("refund_id") == refund.id:
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


# -- outbox, warnings, webhooks, sweeps -------------------------------------------------------


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


def outbox(now: datetime, *, status: str | None, page: int, keep: tuple[str, int] | None = None):
    """Deliveries and scheduled commands, oldest first, each paged on its own. The JSON lists
    both under "deliveries" in one item shape (docs/REFERENCE.md, Console): a dead refund or email is as much a
    dead letter for the operator as a dead delivery. `keep` ("delivery" | "command", id): the row an
    operator just acted on, shown first with its current state whether or not it matches the filter,
    so a retried or discarded row does not vanish from under the operator; JSON `kept`."""
    query = (
        select(OutboxDelivery, OutboxEvent.name, Order.reference)
        .join(OutboxEvent, OutboxEvent.id == OutboxDelivery.event_id)
        .outerjoin(Order, Order.id == OutboxDelivery.order_id)
        .order_by(OutboxDelivery.id)
    )
    # Oldest first by id, the order rows are written in: created_at has no index, and sorting
    # a million deliveries by it for the unfiltered first page took seconds (bench/console.py).
    cquery = (
        select(ScheduledCommand, Order.reference)
        .outerjoin(Order, Order.id == ScheduledCommand.order_id)
        .order_by(ScheduledCommand.id)
    )
    if status == WAITING:
        query = query.where(OutboxDelivery.status == "pending", OutboxDelivery.failure_kind == FAILURE_PROVIDER)
        cquery = cquery.where(ScheduledCommand.status == "pending", ScheduledCommand.failure_kind == FAILURE_PROVIDER)
    elif status:
        query = query.where(OutboxDelivery.status == status)
        cquery = cquery.where(ScheduledCommand.status == status)
    rows, meta = paging(query, page)
    crows, cmeta = paging(cquery, page)
    details = [delivery_detail(d, name, ref, now) for d, name, ref in rows]
    commands = [command_json(c, ref, now) for c, ref in crows]
    keys = ("id", "event", "handler", "status", "attempts", "last_error", "order_reference", "waiting_for_provider")
    data = {
        "status": status,
        "deliveries": [{k: d[k] for k in keys} for d in details] + [command_item(c, ref) for c, ref in crows],
        "deliveries_page": meta,
        "commands_page": cmeta,
        "kept": None,
    }
    if keep is not None:
        kind, work_id = keep
        if kind == "delivery":
            row = db.session.execute(_one_delivery(work_id)).first()
            if row is not None:
                kept = {**delivery_detail(row[0], row[1], row[2], now), "kept": True}
                details = [kept] + [d for d in details if d["id"] != work_id]
                data["kept"] = {k: kept[k] for k in keys}
        else:
            row = db.session.execute(
                select(ScheduledCommand, Order.reference)
                .outerjoin(Order, Order.id == ScheduledCommand.order_id)
                .where(ScheduledCommand.id == work_id)
            ).first()
            if row is not None:
                kept = {**command_json(row[0], row[1], now), "kept": True}
                commands = [kept] + [c for c in commands if c["id"] != work_id]
                data["kept"] = command_item(row[0], row[1])
    return data, details, commands


def _one_delivery(work_id: int):
    return (
        select(OutboxDelivery, OutboxEvent.name, Order.reference)
        .join(OutboxEvent, OutboxEvent.id == OutboxDelivery.event_id)
        .outerjoin(Order, Order.id == OutboxDelivery.order_id)
        .where(OutboxDelivery.id == work_id)
    )


def dead_groups() -> list[dict]:
    """Dead letters by handler / command kind, most first: what the 'retry all' buttons offer."""
    groups = [
        {"kind": "delivery", "name": name, "count": n}
        for name, n in db.session.execute(
            select(OutboxDelivery.handler, func.count())
            .where(OutboxDelivery.status == "dead")
            .group_by(OutboxDelivery.handler)
        ).all()
    ]
    groups += [
        {"kind": "command", "name": name, "count": n}
        for name, n in db.session.execute(
            select(ScheduledCommand.kind, func.count())
            .where(ScheduledCommand.status == "dead")
            .group_by(ScheduledCommand.kind)
        ).all()
    ]
    return sorted(groups, key=lambda g: (-g["count"], g["kind"], g["name"]))


def restore_warnings(now: datetime, *, state: str | None, page: int):
    query = (
        select(RestoreWarning, Order.reference)
        .outerjoin(Order, Order.id == RestoreWarning.order_id)
        .order_by(RestoreWarning.created_at, RestoreWarning.id)
    )
    if state:
        query = query.where(RestoreWarning.state == state)
    rows, meta = paging(query, page)
    details = [warning_detail(w, ref, now) for w, ref in rows]
    keys = ("id", "order_reference", "variant_id", "quantity", "reason", "state")
    return {"state": state, "warnings": [{k: d[k] for k in keys} for d in details], **meta}, details


def webhooks(*, outcome: str | None, page: int) -> dict:
    query = (
        select(WebhookReceipt, Order.reference)
        .outerjoin(Order, Order.id == WebhookReceipt.order_id)
        .order_by(WebhookReceipt.received_at.desc(), WebhookReceipt.id.desc())
    )
    if outcome:
        query = query.where(WebhookReceipt.outcome == outcome)
    rows, meta = paging(query, page)
    # Each outcome counted up to COUNT_CAP + 1 along ix_webhook_receipts_outcome_received_at: a
    # GROUP BY over every receipt ever (about two per paid order) read the whole table on each refresh.
    counts, capped = {}, []
    for name in WEBHOOK_OUTCOMES:
        n = db.session.execute(
            select(func.count()).select_from(
                select(WebhookReceipt.outcome).where(WebhookReceipt.outcome == name).limit(COUNT_CAP + 1).subquery()
            )
        ).scalar_one()
        if n:
            counts[name] = min(n, COUNT_CAP)
        if n > COUNT_CAP:
            capped.append(name)
    return {
        "outcome": outcome,
        "counts": counts,
        "counts_capped": capped,
        "webhooks": [receipt_json(r, ref) for r, ref in rows],
        **meta,
    }


def sweep_json(cycle: ReconciliationCycle, now: datetime, problems: list | None = None) -> dict:
    """docs/REFERENCE.md, Console: the recorded cycle, plus its outcome in words ("ok" only when
    nothing went wrong) and its errors as `problems` an operator can act on."""
    duration = None
    if cycle.finished_at is not None:
        duration = round((as_utc(cycle.finished_at) - as_utc(cycle.started_at)).total_seconds(), 3)
    if problems is None:
        problems = _sweep_problems([cycle], now).get(cycle.id, [])
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


# How many cycles past the page are read to tell for how long an error has repeated.
REPEAT_LOOKBACK = 100


def _sweep_problems(cycles: list, now: datetime) -> dict:
    """The cycles' errors in words, with the orders they name read in one query."""
    ids = {e.get("order_id") for c in cycles for e in (c.errors or []) if isinstance(e, dict)}
    ids = [i for i in ids if isinstance(i, int)]
    orders = {}
    if ids:
        orders = {
            o.id: o
            for o in db.session.execute(
                select(
                    Order.id, Order.reference, Order.status, Order.provider_next_check_at, Order.payment_processing_at
                ).where(Order.id.in_(ids))
            ).all()
        }
    latest = db.session.execute(select(func.max(ReconciliationCycle.started_at))).scalar()
    interval = current_app.config["RECONCILIATION_INTERVAL_SECONDS"]
    return sweep_words.problems_by_cycle(cycles, orders, now, sweep_words.next_cycle(latest, interval))


def sweeps(now: datetime, *, page: int) -> dict:
    order = (ReconciliationCycle.started_at.desc(), ReconciliationCycle.id.desc())
    query = select(ReconciliationCycle).order_by(*order)
    rows, meta = paging(query, page, per_page=50)
    cycles = [c for (c,) in rows]
    history = list(cycles)
    if cycles:  # the cycles just past the page, only to count how long an error has repeated
        last = cycles[-1]
        history += (
            db.session.execute(
                select(ReconciliationCycle)
                .where(
                    or_(
                        ReconciliationCycle.started_at < last.started_at,
                        and_(ReconciliationCycle.started_at == last.started_at, ReconciliationCycle.id < last.id),
                    )
                )
                .order_by(*order)
                .limit(REPEAT_LOOKBACK)
            )
            .scalars()
            .all()
        )
    problems = _sweep_problems(history, now)
    return {"cycles": [sweep_json(c, now, problems.get(c.id, [])) for c in cycles], **meta}
