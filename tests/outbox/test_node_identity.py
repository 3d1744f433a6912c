"""Every identity a process leaves in PostgreSQL and Redis starts with its node's name
(BACKSTOP_NODE_NAME, config NODE_NAME; shop.node): a claim's `claimed_by`, a lease's holder, an
RQ worker's name and `hostname`, the scheduler's beat; and every log line carries it. A dead
holder's lease is taken over at once only when its node is ours and ours is this machine's host
name: a pid is this machine's to check only then."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading

import pytest

from shop import queue
from shop.node import LOG_FORMAT_TEXT, host_node_name, node_name
from shop.outbox.leases import holder_is_gone, holder_name
from shop.outbox.runner import worker_identity


@pytest.fixture(scope="module")
def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    return gone.pid


def test_claims_lease_holders_workers_and_the_scheduler_are_named_after_the_node(make_fresh_app):
    app = make_fresh_app(NODE_NAME="node-a")
    with app.app_context():
        assert node_name() == "node-a"
        assert worker_identity() == f"node-a:{os.getpid()}:{threading.get_ident()}"
        holder = holder_name()
        assert holder.startswith(f"node-a:{os.getpid()}:") and holder != holder_name()  # a fresh nonce each time
        worker = queue.make_worker()
        assert worker.name == f"node-a:backstop-{os.getpid()}" and worker.hostname == "node-a"
        worker.pulse_key = ""  # its record only, no pulse thread left in the test process (support.registered_worker)
        worker.register_birth()
        worker.heartbeat()
        scheduler = queue.make_scheduler()
        assert scheduler.beat_name == f"node-a:scheduler-{os.getpid()}"
        scheduler.heartbeat()
        seen = {p["role"]: p for p in queue.processes()}
        assert seen["worker"]["node"] == seen["scheduler"]["node"] == "node-a"
        # The machine stays visible beside the node.
        assert seen["worker"]["host"] == seen["scheduler"]["host"] == socket.gethostname()


def test_the_default_node_is_the_host_name(make_fresh_app):
    app = make_fresh_app()
    with app.app_context():
        assert node_name() == host_node_name() == socket.gethostname()[:60]
        assert worker_identity().startswith(f"{socket.gethostname()[:60]}:{os.getpid()}:")


def test_a_dead_holders_pid_is_checked_only_on_a_node_named_after_this_machine(make_fresh_app, dead_pid):
    host = host_node_name()
    with make_fresh_app().app_context():  # node = this host name
        assert holder_is_gone(f"{host}:{dead_pid}:cafe0001")
        assert not holder_is_gone(f"{host}:{os.getpid()}:cafe0001")  # ourselves
        assert not holder_is_gone(f"elsewhere:{dead_pid}:cafe0001")  # another node: it lapses by itself
    with make_fresh_app(NODE_NAME=host).app_context():  # set, but to the host name: the same machine
        assert holder_is_gone(f"{host}:{dead_pid}:cafe0001")
    with make_fresh_app(NODE_NAME="node-a").app_context():
        # Named by hand: another container may carry the same name with its own pids, so a
        # holder of node-a is never judged by this machine's process table.
        assert not holder_is_gone(f"node-a:{dead_pid}:cafe0001")
        assert not holder_is_gone(f"{host}:{dead_pid}:cafe0001")


def test_every_log_line_carries_the_node(make_fresh_app, caplog):
    app = make_fresh_app(NODE_NAME="node-a")
    caplog.set_level(logging.INFO)
    with app.app_context():
        logging.getLogger("shop.outbox").warning("a delivery failed")
    with make_fresh_app(NODE_NAME="node-b").app_context():
        logging.getLogger("shop.leases").info("took over")
    records = [r for r in caplog.records if r.getMessage() in ("a delivery failed", "took over")]
    assert [r.node for r in records] == ["node-a", "node-b"]
    line = logging.Formatter(LOG_FORMAT_TEXT).format(records[0])
    assert " WARNING [node-a] shop.outbox a delivery failed" in line
    # Outside any app (a library's thread, gunicorn's own lines): the node of the app this process built.
    outside = logging.getLogger("elsewhere").makeRecord("elsewhere", logging.INFO, __file__, 1, "x", (), None)
    assert outside.node == "node-b"
