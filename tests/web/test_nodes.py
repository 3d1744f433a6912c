"""Nodes on the dashboard and in /metrics (docs/REFERENCE.md, Operations, Nodes): processes
grouped by the node they belong to (BACKSTOP_NODE_NAME), a node whose every process stopped
beating shown as gone with the deliveries, commands and leases its identities still hold.
Heartbeats are written by the code the real processes run (an RQ worker registration and the
scheduler's own beat) in apps named after two nodes; the web app is a third."""

from __future__ import annotations

import re
import time
from datetime import timedelta

from shop import queue
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Lease, OutboxDelivery, OutboxEvent, ScheduledCommand, WorkStatus
from shop.scheduling.lease import LEASE_NAME as SWEEP_LEASE
from support import log_in, registered_worker

from .test_ops import scrape

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}


def beat_as(app):
    """A worker and a scheduler of `app`'s node leave their heartbeats; returns them to beat again."""
    with app.app_context():
        worker = registered_worker()
        worker.heartbeat()
        scheduler = queue.make_scheduler()
        scheduler.heartbeat()
    return worker, scheduler


def beat_again(app, worker, scheduler) -> None:
    with app.app_context():
        worker.heartbeat()
        scheduler.heartbeat()


def nodes_of(data: dict) -> dict:
    return {n["node"]: n for n in data["nodes"]}


def test_each_nodes_processes_are_grouped_under_it_on_the_dashboard_and_in_metrics(make_fresh_app):
    web = make_fresh_app(NODE_NAME="web-1")
    node_a, node_b = make_fresh_app(NODE_NAME="node-a"), make_fresh_app(NODE_NAME="node-b")
    client = web.test_client()
    log_in(web, client)
    beat_as(node_a)
    beat_as(node_b)

    data = client.get("/console/", headers=JSON).get_json()
    nodes = nodes_of(data)
    assert set(nodes) == {"node-a", "node-b"}  # the web process beats nowhere: not a node here
    for name, node in nodes.items():
        assert node["state"] == "up" and node["up"] is True and node["last_beat_age_seconds"] is not None
        assert sorted(p["role"] for p in node["processes"]) == ["scheduler", "worker"]
        assert all(p["node"] == name and p["beat_age_seconds"] is not None for p in node["processes"])
        assert node["words"].startswith(f"node {name}: 2 of 2 processes beating, the latest beat ")
        # Their names say where they run: node:backstop-pid, node:scheduler-pid.
        assert {p["name"].split(":")[0] for p in node["processes"]} == {name}
    assert {p["node"] for p in data["processes"]} == {"node-a", "node-b"}  # the flat list names it too

    html = client.get("/console/", headers=HTML).get_data(as_text=True)
    for name in ("node-a", "node-b"):
        group = re.search(rf'<tbody[^>]*data-node="{name}"[^>]*>.*?</tbody>', html, re.S).group(0)
        assert 'data-state="up"' in group and group.count("<tr") == 3  # the node's line, then its two processes

    samples = scrape(web)
    for name in ("node-a", "node-b"):
        assert samples[("shop_node_up", (("node", name),))] == 1
        assert samples[("shop_node_processes_beating", (("node", name), ("role", "worker")))] == 1
        assert samples[("shop_node_processes_beating", (("node", name), ("role", "scheduler")))] == 1
        assert samples[("shop_node_held_work", (("kind", "delivery"), ("node", name)))] == 0
        ages = [
            labels
            for (metric, labels) in samples
            if metric == "shop_process_heartbeat_age_seconds" and ("node", name) in labels
        ]
        assert len(ages) == 2
    assert samples[("shop_processes_beating", (("role", "worker"),))] == 2  # the whole shop's, as before


def test_a_node_that_stopped_beating_is_gone_with_the_deliveries_commands_and_lease_it_held(make_fresh_app):
    """node-b's worker and scheduler stop beating (their records stay, as after a SIGKILL or a
    lost machine); node-a keeps beating. Past HEALTH_STALE_SECONDS node-b is gone, in words, with
    what its identities still hold; node-a's own claim is not counted against it."""
    web = make_fresh_app(NODE_NAME="web-1", HEALTH_STALE_SECONDS=1)
    node_a = make_fresh_app(NODE_NAME="node-a", HEALTH_STALE_SECONDS=1)
    node_b = make_fresh_app(NODE_NAME="node-b", HEALTH_STALE_SECONDS=1)
    client = web.test_client()
    log_in(web, client)
    now = utcnow()
    until = now + timedelta(seconds=60)
    with web.app_context():
        event = OutboxEvent(order_id=None, name="OrderCancelled", payload={})
        db.session.add(event)
        db.session.flush()
        claims = [("node-b:4242:140001", "restore_inventory"), ("node-b:4242:140001", "email"), ("node-a:77:1", "x")]
        for who, handler in claims:
            db.session.add(
                OutboxDelivery(
                    event_id=event.id,
                    handler=handler,
                    status=WorkStatus.PROCESSING,
                    claimed_by=who,
                    claimed_until=until,
                )
            )
        db.session.add(
            ScheduledCommand(
                kind="send_email",
                payload={},
                status=WorkStatus.PROCESSING,
                claimed_by="node-b:4243:1",
                claimed_until=until,
            )
        )
        db.session.add(Lease(name=SWEEP_LEASE, holder="node-b:4242:cafe0001", expires_at=now + timedelta(seconds=300)))
        db.session.add(Lease(name="payment-queue", holder="ghost:9:cafe0002", expires_at=now - timedelta(seconds=5)))
        db.session.commit()

    a_worker, a_scheduler = beat_as(node_a)
    beat_as(node_b)
    assert nodes_of(client.get("/console/", headers=JSON).get_json())["node-b"]["state"] == "up"
    time.sleep(1.5)  # a sleep: RQ writes the worker's beat on the real clock, so only waiting ages it
    beat_again(node_a, a_worker, a_scheduler)

    data = client.get("/console/", headers=JSON).get_json()
    nodes = nodes_of(data)
    assert nodes["node-a"]["state"] == "up" and nodes["node-a"]["held"]["deliveries"] == 1
    gone = nodes["node-b"]
    assert gone["state"] == "gone" and gone["up"] is False and all(p["stalled"] for p in gone["processes"])
    assert gone["held"]["deliveries"] == 2 and gone["held"]["commands"] == 1
    assert [(lease["name"], lease["holder"], lease["lapsed"]) for lease in gone["held"]["leases"]] == [
        (SWEEP_LEASE, "node-b:4242:cafe0001", False)
    ]
    assert re.match(
        r"node node-b: no process has beaten for \d+ s; gone\. It still holds 2 outbox deliveries, 1 "
        r"scheduled command and the sweep lease \(until [^)]+ UTC\); its claims end by [^,]+ UTC, then "
        r"the other nodes' workers take them\.$",
        gone["words"],
    ), gone["words"]
    # A node no worker or scheduler of which is known, whose holder left a lease behind.
    ghost = nodes["ghost"]
    assert ghost["state"] == "unseen" and ghost["processes"] == [] and ghost["held"]["leases"][0]["lapsed"] is True
    assert "the payment queue's lease (lapsed at" in ghost["words"]
    assert [n["node"] for n in data["nodes"]] == ["ghost", "node-b", "node-a"]  # what needs a human first

    [card] = [c for c in data["cards"] if c["key"] == "processes"]
    assert card["ok"] is False and "Node node-b: no process has beaten for" in card["words"]
    assert "node-a" not in card["words"]

    # node-a keeps beating before each look: under load the looks above may take longer than its
    # HEALTH_STALE_SECONDS of 1 s, and a node-a gone stale by then is the product being right.
    beat_again(node_a, a_worker, a_scheduler)
    html = client.get("/console/", headers=HTML).get_data(as_text=True)
    group = re.search(r'<tbody[^>]*data-node="node-b"[^>]*>.*?</tbody>', html, re.S).group(0)
    assert 'data-state="gone"' in group and "gone." in group and "the sweep lease" in group

    beat_again(node_a, a_worker, a_scheduler)
    samples = scrape(web)
    assert samples[("shop_node_up", (("node", "node-a"),))] == 1
    assert samples[("shop_node_up", (("node", "node-b"),))] == 0
    assert samples[("shop_node_up", (("node", "ghost"),))] == 0
    assert samples[("shop_node_held_work", (("kind", "delivery"), ("node", "node-b")))] == 2
    assert samples[("shop_node_held_work", (("kind", "command"), ("node", "node-b")))] == 1
    assert samples[("shop_node_held_work", (("kind", "lease"), ("node", "node-b")))] == 1
    assert samples[("shop_node_processes_beating", (("node", "node-b"), ("role", "worker")))] == 0
