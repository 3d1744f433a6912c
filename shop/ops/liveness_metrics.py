"""The /metrics families that come from the processes and Redis rather than the database's rows
(docs/REFERENCE.md, Metrics): the outbox's lag, each process's heartbeat, the processes grouped by
node with the work they hold, and the RQ queues' depths. metrics.py collects them with the rest."""

from __future__ import annotations

import logging

from flask import current_app
from prometheus_client.core import GaugeMetricFamily

from .. import queue
from ..domain.deadlines import as_utc
from ..queue.beats import STALL_AFTER_SECONDS
from .health import oldest_due, quiet_for
from .nodes import UP, group, held_work

log = logging.getLogger("shop.ops")


def liveness(now):
    """Lag from the database (always); heartbeats and queue depths from Redis, left out of the
    scrape (with a log line) while Redis does not answer: the other families still count."""
    lag = GaugeMetricFamily(
        "shop_outbox_lag_seconds",
        "How long the oldest due pending item has waited (0: nothing due)",
        labels=["kind"],
    )
    for kind, at in oldest_due(now).items():
        lag.add_metric([kind], (now - as_utc(at)).total_seconds() if at else 0)
    yield lag
    try:
        processes = queue.processes()
        pulses = queue.pulses()
        queues = queue.queue_depths(now)
    except Exception as exc:
        log.warning("metrics: Redis unreachable, heartbeats and queue depths left out: %s", exc)
        return
    stale = current_app.config["HEALTH_STALE_SECONDS"]
    ages = GaugeMetricFamily(
        "shop_process_heartbeat_age_seconds",
        "Seconds since each process's last heartbeat (its pulse, for a process that pulses)",
        labels=["role", "node", "name"],
    )
    beating = GaugeMetricFamily(
        "shop_processes_beating",
        "Processes not stalled (pulse within a few seconds, beat within HEALTH_STALE_SECONDS)",
        labels=["role"],
    )
    counts = {"worker": 0, "scheduler": 0}
    stall_after = min(STALL_AFTER_SECONDS, stale)
    for p in processes:
        p["pulse_at"], p["beat_age_seconds"], p["stalled"] = pulses.get(p["name"]), None, True
        if p["last_beat"] is None:
            continue
        age, p["stalled"] = quiet_for(p, now, stale, stall_after)
        p["beat_age_seconds"] = age
        ages.add_metric([p["role"], p["node"], p["name"]], age)
        counts[p["role"]] += not p["stalled"]
    for role, count in counts.items():
        beating.add_metric([role], count)
    yield ages
    yield beating
    yield from _nodes(processes, now, stale)
    depth = GaugeMetricFamily(
        "shop_queue_depth", "Jobs waiting in each RQ queue, and held by rq-scheduler", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "shop_queue_oldest_age_seconds",
        "Age of the oldest waiting job (rq-scheduler: of the oldest one already due)",
        labels=["queue"],
    )
    for q in queues:
        depth.add_metric([q["name"]], q["depth"])
        oldest.add_metric([q["name"]], q["oldest_age_seconds"] or 0)
    yield depth
    yield oldest


def _nodes(processes, now, stale):
    """The processes grouped by node (ops.nodes): whether each node is up, its processes beating
    by role, and the work its identities hold (a node that is not up and holds work is work
    waiting for its claims and leases to lapse)."""
    nodes = group(processes, held_work(now), stale)
    up = GaugeMetricFamily("shop_node_up", "1 when at least one process of the node is not stalled", labels=["node"])
    beating = GaugeMetricFamily(
        "shop_node_processes_beating",
        "Processes of the node not stalled",
        labels=["node", "role"],
    )
    held = GaugeMetricFamily(
        "shop_node_held_work",
        "Deliveries and scheduled commands claimed (processing) by the node's processes, and leases they hold",
        labels=["node", "kind"],
    )
    for n in nodes:
        up.add_metric([n["node"]], 1 if n["state"] == UP else 0)
        for role in ("worker", "scheduler"):
            beating.add_metric(
                [n["node"], role],
                sum(1 for p in n["processes"] if p["role"] == role and not p["stalled"]),
            )
        h = n["held"]
        for kind, count in (("delivery", h["deliveries"]), ("command", h["commands"]), ("lease", len(h["leases"]))):
            held.add_metric([n["node"], kind], count)
    yield up
    yield beating
    yield held
