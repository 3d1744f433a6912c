"""The dashboard's numbers: what needs a human (stuck orders, dead letters, open restore warnings,
failed refunds, the last sweep), the payment provider as the circuit breaker sees it, and the
processes and queues with the same verdict /healthz gives."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import current_app
from sqlalchemy import func, select

from ..domain.deadlines import as_utc
from ..domain.order import LIVE, LIVE_STATUSES
from ..domain.timestamps import iso
from ..extensions import db
from ..models import (
    Order,
    OutboxDelivery,
    Refund,
    RestoreWarning,
    ScheduledCommand,
    WarningState,
    WorkStatus,
)
from ..ops import nodes
from ..ops.health import snapshot
from ..payments.checkout_queue import LEASE_NAME as PAYMENT_QUEUE_LEASE
from ..provider import guard
from ..scheduling.lease import LEASE_NAME as SWEEP_LEASE
from ..scheduling.past_cycles import last_success_at, latest_cycle
from ..scheduling.stuck import stuck_cutoff
from .format import human_age, human_time
from .rows import REFUND_NEEDS_OPERATOR, age_seconds, sweep_json
from .words import BREAKER_WORDS


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
        s.value: {
            "count": per_status.get(s, (0, None))[0],
            "oldest_age_seconds": age_seconds(now, per_status.get(s, (0, None))[1]),
        }
        for s in LIVE
    }
    oldest_stuck = min((o for _, o in per_status.values() if o is not None), default=None, key=as_utc)
    stuck = {
        "count": sum(v["count"] for v in by_status.values()),
        "oldest_age_seconds": age_seconds(now, oldest_stuck),
        "stuck_after_seconds": int((now - cutoff).total_seconds()),
        "by_status": by_status,
    }

    # A dead letter's age counts from when its work was created: how long it has gone undone.
    deliveries = _count_and_oldest(
        OutboxDelivery, [OutboxDelivery.status == WorkStatus.DEAD], OutboxDelivery.created_at, now
    )
    commands = _count_and_oldest(
        ScheduledCommand, [ScheduledCommand.status == WorkStatus.DEAD], ScheduledCommand.created_at, now
    )
    ages = [a for a in (deliveries["oldest_age_seconds"], commands["oldest_age_seconds"]) if a is not None]
    dead = {
        "count": deliveries["count"] + commands["count"],
        "oldest_age_seconds": max(ages) if ages else None,
        "deliveries": deliveries,
        "commands": commands,
    }

    warnings = _count_and_oldest(
        RestoreWarning, [RestoreWarning.state == WarningState.OPEN], RestoreWarning.created_at, now
    )
    # Refunds whose money did not go back and that nobody has dealt with: aged from the failure.
    failed_refunds = _count_and_oldest(Refund, REFUND_NEEDS_OPERATOR, Refund.failed_at, now)

    cycle = latest_cycle()
    last_ok = last_success_at()
    return {
        "now": iso(now),
        "stuck_orders": stuck,
        "dead_letters": dead,
        "restore_warnings": warnings,
        "refunds_failed": failed_refunds["count"],
        "refunds_failed_oldest_age_seconds": failed_refunds["oldest_age_seconds"],
        "last_sweep": sweep_json(cycle, now) if cycle else None,
        "last_successful_sweep_at": iso(last_ok),
        "provider": provider_state(now),
    }


def provider_state(now: datetime) -> dict:
    """The payment provider as the circuit breaker sees it (provider.guard), in words."""
    view = guard.get().breaker_view()
    state, failures = view["state"], int(view.get("failures") or 0)
    opened = view["opened_at"] if state != guard.CLOSED and view["opened_at"] else None
    words = BREAKER_WORDS.get(state, state)
    if state == guard.CLOSED and failures:
        # Closed, but the latest calls failed: not "reachable" until one succeeds.
        threshold = current_app.config["STRIPE_BREAKER_THRESHOLD"]
        words = (
            f"Failing: the last {failures} call(s) to the provider failed in a row (after {threshold} it "
            "stops calling for a while); checkout takes orders and customers pay later with “Pay now”."
        )
    checked = view.get("checked_at")
    since = view.get("check_since")
    return {
        "state": state,
        "failures": failures,
        "words": words,
        "since_seconds": max(0, int(now.timestamp() - opened)) if opened else None,
        "shared": view["shared"],
        # The provider watch's latest check (provider.watch): whether or not anyone paid.
        "checked_at": iso(datetime.fromtimestamp(checked, timezone.utc)) if checked else None,
        "checked_ago_seconds": max(0, int(now.timestamp() - checked)) if checked else None,
        "check_ok": view.get("check_ok"),
        "check_words": view.get("check_words") or "",
        "check_same_for_seconds": max(0, int(now.timestamp() - since)) if since else None,
        "check_since": since,
    }


def liveness(now: datetime) -> dict:
    """Processes with their heartbeat ages, queues with depth and the age of their oldest due
    item, the next sweep, and the same verdict /healthz gives (shop.ops.health)."""
    found = snapshot(now, with_queues=True)
    processes = [
        {
            "role": p["role"],
            "name": p["name"],
            "node": p["node"],
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
    by_node = nodes.group(processes, nodes.held_work(now), found["stale_seconds"])
    queues = [{**q, "oldest_age_seconds": _whole(q["oldest_age_seconds"])} for q in found["queues"] or ()]
    for kind, model in (("outbox deliveries", OutboxDelivery), ("scheduled commands", ScheduledCommand)):
        count, oldest = db.session.execute(
            select(func.count(), func.min(model.next_attempt_at)).where(
                model.status == WorkStatus.PENDING, model.next_attempt_at <= now
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
            "stall_after_seconds": found["stall_after_seconds"],
            "outbox_lag_limit_seconds": found["outbox_lag_limit_seconds"],
        },
        "processes": processes,
        "nodes": [node_json(n) for n in by_node],
        "queues": queues,
        "next_sweep_at": iso(found["next_sweep_at"]),
    }


LEASE_WORDS = {SWEEP_LEASE: "the sweep lease", PAYMENT_QUEUE_LEASE: "the payment queue's lease"}


def node_json(n: dict) -> dict:
    """A node (ops.nodes.group) as the dashboard's JSON has it, with its state in words."""
    held = n["held"]
    return {
        "node": n["node"],
        "state": n["state"],
        "up": n["state"] == nodes.UP,
        "last_beat_age_seconds": _whole(n["last_beat_age_seconds"]),
        "processes": n["processes"],
        "held": {
            "deliveries": held["deliveries"],
            "commands": held["commands"],
            "claimed_until": iso(held["claimed_until"]),
            "leases": [{**lease, "expires_at": iso(lease["expires_at"])} for lease in held["leases"]],
        },
        "words": node_words(n),
    }


def node_words(n: dict) -> str:
    """`node web-2: no process has beaten for 2 min; gone. It still holds ...`"""
    name, state, procs, newest = n["node"] or "(unnamed)", n["state"], n["processes"], n["last_beat_age_seconds"]
    if state in (nodes.UP, nodes.STALLED):
        beating = [p for p in procs if not p["stalled"]]
        words = f"node {name}: {len(beating)} of {len(procs)} process{'' if len(procs) == 1 else 'es'} beating, "
        words += f"the latest beat {human_age(newest)} ago"
        if state == nodes.UP:
            return words + "."
        stalled = [
            f"{p['role']} {p['name']} (pid {p['pid']}, last beat {human_age(p['beat_age_seconds'])} ago)"
            for p in procs
            if p["stalled"]
        ]
        return words + f"; stalled: {', '.join(stalled)}; not up." + held_words(n["held"])
    if state == nodes.GONE:
        words = (
            f"node {name}: no process has beaten for {human_age(newest)}; gone."
            if newest is not None
            else f"node {name}: no process of it has a heartbeat; gone."
        )
    else:
        words = f"node {name}: no worker or scheduler of it is known to Redis now."
    return words + held_words(n["held"])


def held_words(held: dict) -> str:
    """What a node that is not up still holds, or nothing."""
    things = []
    if held["deliveries"]:
        things.append(f"{held['deliveries']} outbox deliver{'y' if held['deliveries'] == 1 else 'ies'}")
    if held["commands"]:
        things.append(f"{held['commands']} scheduled command{'' if held['commands'] == 1 else 's'}")
    for lease in held["leases"]:
        what = LEASE_WORDS.get(lease["name"], f"the {lease['name']} lease")
        until = "lapsed at" if lease["lapsed"] else "until"
        things.append(f"{what} ({until} {human_time(lease['expires_at'])})")
    if not things:
        return " It holds no work."
    listed = things[0] if len(things) == 1 else ", ".join(things[:-1]) + " and " + things[-1]
    words = f" It still holds {listed}"
    if held["deliveries"] or held["commands"]:
        words += f"; its claims end by {human_time(held['claimed_until'])}, then the other nodes' workers take them"
    return words + "."


def _whole(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds)
