"""Nodes (docs/REFERENCE.md, Operations): the processes as liveness sees them, grouped by the node
they belong to (BACKSTOP_NODE_NAME), with the work each node's identities hold in the database.

Nodes know each other only through PostgreSQL and Redis: a node is the first part of the names
its processes beat under and of the identities it claims work with (shop.node). A node is
  - `up` while none of its processes is stalled (ops.health: each pulse within a few seconds,
    each beat within HEALTH_STALE_SECONDS),
  - `stalled` while some of its processes are and others are not (a worker stopped beside a live
    scheduler): not up, and its stalled processes are named,
  - `gone` when it has processes and every one of them stopped beating longer ago than that,
  - `unseen` when no worker or scheduler of it is known but an identity of it holds work (a
    `flask shop sweep` run there, or a node whose every record has expired).
Held work: deliveries and scheduled commands still claimed (`processing`) by the node's
identities, with the latest claim's end, and the leases its holders have. A gone node's claims
lapse at that end and are taken by the others (the relay re-announces them); its leases lapse
too, and a live holder elsewhere takes them when they do.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from ..domain.deadlines import as_utc
from ..extensions import db
from ..models import Lease, OutboxDelivery, ScheduledCommand, WorkStatus
from ..node import node_of

UP, STALLED, GONE, UNSEEN = "up", "stalled", "gone", "unseen"


def _empty_held() -> dict:
    return {"deliveries": 0, "commands": 0, "claimed_until": None, "leases": []}


def held_work(now: datetime) -> dict[str, dict]:
    """Per node: claimed deliveries and commands (`processing`), the latest claim's end, and the
    leases (name, holder, expires_at, lapsed). One grouped query per table: claims are few."""
    held: dict[str, dict] = {}
    for key, model in (("deliveries", OutboxDelivery), ("commands", ScheduledCommand)):
        rows = db.session.execute(
            select(model.claimed_by, func.count(), func.max(model.claimed_until))
            .where(model.status == WorkStatus.PROCESSING)
            .group_by(model.claimed_by)
        ).all()
        for claimed_by, count, until in rows:
            entry = held.setdefault(node_of(claimed_by), _empty_held())
            entry[key] += count
            if until is not None:
                until = as_utc(until)
                entry["claimed_until"] = max(filter(None, (entry["claimed_until"], until)))
    for name, holder, expires_at in db.session.execute(
        select(Lease.name, Lease.holder, Lease.expires_at).order_by(Lease.name)
    ).all():
        if not holder:
            continue
        held.setdefault(node_of(holder), _empty_held())["leases"].append(
            {"name": name, "holder": holder, "expires_at": as_utc(expires_at), "lapsed": as_utc(expires_at) < now}
        )
    return held


def group(processes: list[dict], held: dict[str, dict], stale: int) -> list[dict]:
    """Each node with its processes (as liveness judged them: `beat_age_seconds`, `stalled`), its
    state, the age of its newest beat, and what it holds. Nodes that are not up first (they need
    a human), then by name. Pure."""
    by_node: dict[str, list[dict]] = {}
    for p in processes:
        by_node.setdefault(p.get("node") or "", []).append(p)
    nodes = []
    for name in set(by_node) | {n for n, h in held.items() if _holds_anything(h)}:
        procs = by_node.get(name, [])
        ages = [p["beat_age_seconds"] for p in procs if p.get("beat_age_seconds") is not None]
        newest = min(ages) if ages else None
        if not procs:
            state = UNSEEN
        elif all(_beating(p, stale) for p in procs):
            state = UP
        elif any(_beating(p, stale) for p in procs):
            state = STALLED
        else:
            state = GONE
        nodes.append(
            {
                "node": name,
                "state": state,
                "last_beat_age_seconds": newest,
                "processes": procs,
                "held": held.get(name) or _empty_held(),
            }
        )
    return sorted(nodes, key=lambda n: (n["state"] == UP, n["node"]))


def _beating(p: dict, stale: int) -> bool:
    """Heard from lately: not `stalled` as liveness judged it (its pulse or its beat, ops.health);
    a process judged by nothing else counts while its beat is within `stale`."""
    age = p.get("beat_age_seconds")
    return age is not None and not p.get("stalled", age > stale)


def _holds_anything(held: dict) -> bool:
    return bool(held["deliveries"] or held["commands"] or held["leases"])
