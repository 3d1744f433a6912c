"""The node this process belongs to (docs/REFERENCE.md, Settings: BACKSTOP_NODE_NAME).

Nodes know each other only through PostgreSQL and Redis, so every identity a process leaves
there starts with its node's name: a worker's claim on a delivery or command
(`node:pid:thread`), a lease's holder (`node:pid:nonce`), an RQ worker's record and the
scheduler's heartbeat. The console and /metrics group processes and the work they hold by that
first part, and every log line carries it.

The name is BACKSTOP_NODE_NAME, or this machine's host name. It never contains ':' (identities
are colon-separated, and the node is everything before the first one).

A pid means something only on the machine that issued it. `is_this_machine` is the one rule for
"may I check that holder's pid here": only when its node is ours AND our node is this machine's
host name. Two containers given the same BACKSTOP_NODE_NAME by mistake (each with its own pids)
would otherwise each find the other's live holders "gone" and take their leases; with the rule,
a node named by hand is never checked by pid, and its leases are taken over when they lapse.
"""

from __future__ import annotations

import logging
import socket

from flask import current_app, has_app_context

# Identities are stored in 100-character columns (claimed_by, leases.holder) with a pid and a
# thread id or nonce after the node.
MAX_LENGTH = 60

_process_node: str | None = None


def host_node_name() -> str:
    """The default node name: this machine's host name, as long as a node name may be."""
    return socket.gethostname()[:MAX_LENGTH].replace(":", "-") or "localhost"


def init_app(app) -> None:
    """Remember the app's node for code that runs without an app context (log records)."""
    global _process_node
    _process_node = app.config.get("NODE_NAME") or host_node_name()


def node_name() -> str:
    """This process's node: the current app's NODE_NAME, else the last app built here, else the
    host name."""
    if has_app_context():
        name = current_app.config.get("NODE_NAME")
        if name:
            return name
    return _process_node or host_node_name()


def node_of(identity: str | None) -> str:
    """The node an identity (a claim, a lease holder, a process name) belongs to: its first part."""
    return (identity or "").partition(":")[0]


def is_this_machine(node: str) -> bool:
    """True when pids issued under `node` are this machine's pids (see the module's note)."""
    return node == node_name() == host_node_name()


# -- log lines ------------------------------------------------------------------------------------

LOG_FORMAT_TEXT = "%(asctime)s %(levelname)s [%(node)s] %(name)s %(message)s"
_factory_installed = False


def add_node_to_log_records() -> None:
    """Every log record made in this process carries `node` (its node's name), whichever logger
    and handler it goes to: the text format prints it, and a structured formatter finds it among
    the record's attributes. Installed once per process, around whatever factory is in place."""
    global _factory_installed
    if _factory_installed:
        return
    previous = logging.getLogRecordFactory()

    def record_with_node(*args, **kwargs):
        record = previous(*args, **kwargs)
        if not hasattr(record, "node"):
            record.node = node_name()
        return record

    logging.setLogRecordFactory(record_with_node)
    _factory_installed = True
