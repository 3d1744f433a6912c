"""A port for a process a test starts later (`free_port`), shared by tests/process_support.py and
tests/cluster_support.py. Binding port 0, closing and handing the number on leaves a window in
which any process may take it: with two test runs side by side, and outgoing connections taking
the kernel's ephemeral ports, a started nginx once found its port taken. So a port is chosen
outside the ephemeral range and reserved across processes until the reserving one ends. Imports
nothing of the shop, so a picker process starts at once."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import threading
from collections.abc import Iterator

# The lock file whose byte N reserves port N: a POSIX record lock (fcntl.lockf) belongs to the
# process that took it and is let go when that process ends, however it ends, so a killed run
# never leaves a port reserved. One per user, under the machine's temp folder, for every run.
PORTS_LOCK_FILE = os.path.join(tempfile.gettempdir(), f"backstop-test-ports-{os.getuid()}.lock")
# Where ports are chosen when the kernel's ephemeral range leaves room: below it, above the
# well-known and registered services most machines run (PostgreSQL 5432, Redis 6379, 8000s).
LOWEST_PORT = 10000

_guard = threading.Lock()
_held: set[int] = set()
_lock_file: list[int] = []  # its descriptor, opened once per process and never closed (closing drops the locks)
_order = random.Random()


def ephemeral_ports() -> range:
    """The kernel's range for outgoing connections' local ports (Linux's ip_local_port_range): a
    port in it can be taken by any process's connect() at any moment."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(n) for n in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def _candidates() -> Iterator[int]:
    """Every port outside the ephemeral range (above 1023), from a random place on, so concurrent
    runs rarely try the same ones first."""
    ephemeral = ephemeral_ports()
    outside = [*range(LOWEST_PORT, ephemeral.start), *range(ephemeral.stop, 65536)]
    if not outside:
        outside = [p for p in range(1024, 65536) if p not in ephemeral]
    start = _order.randrange(len(outside))
    for i in range(len(outside)):
        yield outside[(start + i) % len(outside)]


def reserve(port: int) -> bool:
    """Lock `port` for this process; False when another process holds it."""
    if not _lock_file:
        _lock_file.append(os.open(PORTS_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    try:
        fcntl.lockf(_lock_file[0], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
    except OSError:
        return False
    return True


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 for a process started later, reserved until this process (the test
    session) ends: outside the ephemeral range, so no outgoing connection takes it in between, and
    locked in PORTS_LOCK_FILE, so no other test run (nor thread of this one) is handed it too.
    Never handed out twice in a session, so a process of an earlier test still letting go of it
    is never in the way."""
    with _guard:
        for port in _candidates():
            if port in _held or not reserve(port):
                continue
            _held.add(port)  # kept even when something else listens there: it is not ours to use
            if _bindable(port):
                return port
    raise RuntimeError("no port outside the ephemeral range is left to reserve")
