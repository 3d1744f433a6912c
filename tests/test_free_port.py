"""The harness's free_port (port_support.py): a port handed to a process started later must still be
free when that process binds it, with two test runs side by side and outgoing connections taking
ephemeral ports meanwhile. So it is chosen outside the kernel's ephemeral range and reserved for
the whole session across threads and processes, and a dead run's reservations are let go."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

from port_support import ephemeral_ports, free_port, reserve

TESTS = Path(__file__).resolve().parent
# A separate process that takes `count` ports once told "go", prints them and keeps them until
# its stdin closes.
PICKER = (
    "import sys; sys.path.insert(0, {tests!r}); from port_support import free_port; "
    "count = int(sys.argv[1]); sys.stdin.readline(); "
    "print(' '.join(str(free_port()) for _ in range(count)), flush=True); sys.stdin.read()"
)


def _start_picker(count: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PICKER.format(tests=str(TESTS)), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_picked_port_is_outside_the_ephemeral_range_and_bindable_now():
    ephemeral = ephemeral_ports()
    ports = [free_port() for _ in range(20)]
    assert not [p for p in ports if p in ephemeral], f"{ports} against ephemeral {ephemeral}"
    assert all(1024 <= p <= 65535 for p in ports), ports
    assert len(set(ports)) == len(ports), "one session was handed a port twice"
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # raises if something holds it


def test_threads_picking_at_once_never_get_the_same_port():
    picked: list[list[int]] = [[] for _ in range(8)]
    start = threading.Barrier(len(picked))

    def pick(mine: list[int]) -> None:
        start.wait()
        mine.extend(free_port() for _ in range(25))

    threads = [threading.Thread(target=pick, args=(mine,)) for mine in picked]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    every = [p for mine in picked for p in mine]
    assert len(every) == 8 * 25
    assert len(set(every)) == len(every), "two threads were handed the same port"


def test_processes_picking_at_once_never_get_the_same_port_and_a_dead_ones_are_let_go():
    pickers = [_start_picker(40) for _ in range(3)]
    try:
        for p in pickers:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        mine = [free_port() for _ in range(40)]
        theirs = []
        for p in pickers:
            assert p.stdout is not None
            theirs.append([int(n) for n in p.stdout.readline().split()])
        every = mine + [port for ports in theirs for port in ports]
        assert [len(ports) for ports in theirs] == [40, 40, 40]
        assert len(set(every)) == len(every), "two processes were handed the same port"
        # While a picker lives, its ports stay its own: this process cannot reserve them.
        assert not [port for port in theirs[0] if reserve(port)]
    finally:
        for p in pickers:
            if p.stdin is not None:
                p.stdin.close()
        for p in pickers:
            p.wait(timeout=30)
            if p.stdout is not None:
                p.stdout.close()
    # Once it has ended, however it ended, its ports can be reserved again.
    assert all(reserve(port) for port in theirs[0])
