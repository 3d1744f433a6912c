"""A sweep cycle's errors as an operator reads them: which order (by reference, with a link),
what happened in words, what the sweep does next, and repeats collapsed.

The sweep records each error as a dict in `reconciliation_cycles.errors` (shop.scheduling.sweep
`order_error`: pass, order_id, reference, kind, error). Rows written before the reference and the
kind were recorded hold only pass, order_id and error ("ProviderRefused: ..."), and the oldest
may hold a bare string: all three shapes are read here, the missing parts derived from the text
and from the order row.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import url_for

from ..domain.deadlines import as_utc
from ..domain.order import UNPAID, OrderStatus
from ..domain.timestamps import iso
from ..models import CycleStatus
from .format import human_age

# Exception class names of rows recorded before the kind code existed.
KIND_BY_EXCEPTION = {
    "ProviderRefused": "provider_refused",
    "ProviderUnavailable": "provider_unavailable",
    "StaleDataError": "conflict",
    "OperationalError": "database",
    "IntegrityError": "database",
    "DBAPIError": "database",
    "InterfaceError": "database",
}

DOING = {
    "expiry": "cancelling the order for its expired payment window",
    "provider": "asking the payment provider about the order's payment",
}


def normalize(raw) -> dict:
    """One recorded error, whatever its age, as {pass, order_id, reference, kind, error, message}."""
    if not isinstance(raw, dict):
        raw = {"pass": "cycle", "order_id": None, "error": str(raw)}
    error = str(raw.get("error") or "")
    exception, sep, message = error.partition(": ")
    if not sep or not exception.isidentifier():
        exception, message = "", error
    kind = raw.get("kind") or KIND_BY_EXCEPTION.get(exception, "unexpected" if exception else "cycle")
    return {
        "pass": raw.get("pass") or "cycle",
        "order_id": raw.get("order_id"),
        "reference": raw.get("reference"),
        "kind": kind,
        "error": error,
        "exception": exception,
        "message": message.strip(),
    }


def signature(error: dict) -> tuple:
    """What makes two errors "the same": the same order, pass and failure, word for word."""
    return (error["pass"], error["order_id"], error["kind"], error["error"])


def what_happened(error: dict) -> str:
    kind, message = error["kind"], error["message"] or "no details"
    if error["order_id"] is None:
        if kind == "lease_lost":
            return f"The cycle stopped early: {message}."
        if kind == "cycle":
            return f"The cycle reported: {message}."
        return f"The cycle failed ({error['exception'] or kind}: {message})."
    doing = DOING.get(error["pass"], f"working on the order ({error['pass']} pass)")
    if kind == "provider_refused":
        said = f"the payment provider refused the request: {message}"
    elif kind == "provider_unavailable":
        said = f"the payment provider did not answer ({message})"
    elif kind == "conflict":
        said = "someone else changed the order at the same moment, and their change was kept"
    elif kind == "database":
        said = f"the database failed ({message})"
    else:
        said = f"an unexpected error ({error['exception'] or kind}: {message}); the sweep's log has the traceback"
    return f"While {doing}, {said}."


def _at(when: datetime, now: datetime) -> str:
    """ "12:40 UTC (in 10 min)"; the date too when it is not today."""
    when = as_utc(when)
    clock = when.strftime("%H:%M UTC") if when.date() == now.date() else when.strftime("%Y-%m-%d %H:%M UTC")
    return f"{clock} (in {human_age((when - now).total_seconds())})"


def next_step(error: dict, order, now: datetime, next_cycle_at: datetime | None) -> tuple[str, str | None]:
    """What the sweep does about it next, from the order as it is now: (words, ISO time or None)."""
    next_cycle = (
        "retries at the next cycle, " + _at(next_cycle_at, now)
        if next_cycle_at is not None and as_utc(next_cycle_at) > now
        else "retries at the next cycle"
    )
    if error["order_id"] is None:
        return "The next cycle runs both passes again.", iso(next_cycle_at) if next_cycle_at else None
    if order is None:
        return "Nothing: the order no longer exists.", None
    check_at = order.provider_next_check_at
    if check_at is not None and as_utc(check_at) > now and error["pass"] == "provider":
        return f"The sweep leaves it alone until then and asks again at {_at(check_at, now)}.", iso(check_at)
    status = order.status
    watched = status is OrderStatus.CANCELLED and order.late_money_watch_since is not None
    still_its_work = (
        status in UNPAID if error["pass"] == "expiry" else status is OrderStatus.PAYMENT_INITIATED or watched
    )
    if not still_its_work:
        return f"Nothing more: the order has since become {order.status}.", None
    return f"The sweep {next_cycle}.", iso(next_cycle_at) if next_cycle_at else None


def problems_by_cycle(cycles: list, orders: dict, now: datetime, next_cycle_at: datetime | None) -> dict:
    """{cycle id: [problem, ...]} for `cycles` (rows with id, status, errors; newest first, and
    possibly older ones past the page, only to count repeats).

    Identical errors of one cycle are one problem with a `count`; `cycles` says for how many
    cycles in a row (skipped and running ones aside) it has been the same, and `repeats_newer`
    marks an occurrence whose next newer cycle had it too, so a page shows it once, at the top."""
    worked = [c for c in cycles if c.status not in (CycleStatus.SKIPPED, CycleStatus.RUNNING)]
    grouped: dict[int, dict] = {}
    for cycle in worked:
        groups: dict[tuple, dict] = {}
        for raw in cycle.errors or []:
            error = normalize(raw)
            key = signature(error)
            if key in groups:
                groups[key]["count"] += 1
            else:
                groups[key] = {"error": error, "count": 1}
        grouped[cycle.id] = groups
    # Oldest first, so each cycle's streak builds on the one before it.
    streaks: dict[int, dict] = {}
    older: dict = {}
    for cycle in reversed(worked):
        streaks[cycle.id] = {key: older.get(key, 0) + 1 for key in grouped[cycle.id]}
        older = streaks[cycle.id]
    result: dict[int, list] = {}
    newer_keys: set = set()
    for cycle in worked:
        items = []
        for key, group in grouped[cycle.id].items():
            error = group["error"]
            order = orders.get(error["order_id"]) if error["order_id"] is not None else None
            reference = (order.reference if order is not None else None) or error["reference"]
            words, at = next_step(error, order, now, next_cycle_at)
            items.append(
                {
                    "pass": error["pass"],
                    "order_id": error["order_id"],
                    "order_reference": reference,
                    "order_url": url_for("console.order_detail", reference=reference) if reference else None,
                    "kind": error["kind"],
                    "what": what_happened(error),
                    "next": words,
                    "next_at": at,
                    "count": group["count"],
                    "cycles": streaks[cycle.id][key],
                    "repeats_newer": key in newer_keys,
                    "error": error["error"],
                }
            )
        result[cycle.id] = items
        newer_keys = set(grouped[cycle.id])
    return result


def outcome(status: str, problem_count: int) -> tuple[str, str]:
    """(code, words) of a cycle: "ok" only when nothing went wrong."""
    if status == "ok" and problem_count:
        return "ok_with_problems", f"ok with {problem_count} problem{'s' if problem_count != 1 else ''}"
    return status, status


def next_cycle(latest_start: datetime | None, interval_seconds: int) -> datetime | None:
    return as_utc(latest_start) + timedelta(seconds=interval_seconds) if latest_start is not None else None
