"""Process supervision for `flask shop up`: one console for every line, the children started in
their own sessions and stopped in order, and the probes that tell when a child answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import click

from ..redis_client import redis_client

# The User-Agent of `up`'s own probe of /healthz while the shop starts (web_serves): its answers
# (503 until the worker's first heartbeat) are `up`'s business, not lines for the reader, so the
# demo's access log (access_log.py) leaves them out.
UP_PROBE = "backstop-up-probe"

LOCAL = "127.0.0.1"
START_TIMEOUT = 30.0  # seconds a child may take to answer before `up` gives up
APP_STOP_GRACE = 6.0  # web/worker/scheduler, after SIGTERM
SERVICE_STOP_GRACE = 3.0  # sandbox and Redis, after SIGTERM
REAP_WAIT = 2.0  # per child, after its SIGKILL
READER_JOIN = 1.0  # per child, for its output's last lines


def stop_bound(children: int) -> float:
    """The longest `up` spends stopping `children` children after Ctrl-C: both graces, then a
    reap and a last read of each (stop_all)."""
    return APP_STOP_GRACE + SERVICE_STOP_GRACE + children * (REAP_WAIT + READER_JOIN)


class UpError(Exception):
    """Something the person running `up` can act on; shown as one line, never a traceback."""


# Output ---------------------------------------------------------------------------------------


def ellipsis() -> str:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return "…" if "utf" in encoding else "..."


class Console:
    """One writer for everyone: `up`'s own lines and the children's prefixed lines never
    interleave mid-line."""

    COLOURS = ("cyan", "yellow", "green", "magenta", "blue", "red")

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.colour = self.stream.isatty() and not os.environ.get("NO_COLOR")
        self.lock = threading.Lock()
        self.width = 9
        self._colours: dict[str, str] = {}

    def _write(self, text: str) -> None:
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def step(self, text: str) -> None:
        mark = click.style("==>", fg="bright_blue", bold=True) if self.colour else "==>"
        self._write(f"{mark} {text}")

    def line(self, text: str = "", bold: bool = False) -> None:
        self._write(click.style(text, bold=True) if (bold and self.colour) else text)

    def error(self, text: str) -> None:
        message = f"backstop up: {text}"
        with self.lock:
            self.stream.flush()
            sys.stderr.write((click.style(message, fg="red", bold=True) if self.colour else message) + "\n")
            sys.stderr.flush()

    def child(self, name: str, text: str) -> None:
        label = f"{name:<{self.width}} |"
        if self.colour:
            colour = self._colours.setdefault(name, self.COLOURS[len(self._colours) % len(self.COLOURS)])
            label = click.style(label, fg=colour)
        self._write(f"{label} {text}")


# Children --------------------------------------------------------------------------------------


def _parent_death_signal():
    """A preexec hook that makes the child receive SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook():
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return hook


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    role: str  # "app" (web/worker/scheduler) or "service" (redis/sandbox)
    mute: tuple = ()  # substrings of lines not worth a person's attention
    reader: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Supervisor:
    """Starts children with prefixed output and stops every one of them, whatever happens."""

    def __init__(self, console: Console):
        self.console = console
        self.children: list[Child] = []
        self.stopping = False
        self.force = False
        self._preexec = _parent_death_signal()

    def start(
        self, name: str, argv: list[str], env: dict, cwd: str, role: str, mute: tuple = (), pass_fds: tuple = ()
    ) -> Child:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self._preexec,
            pass_fds=pass_fds,
        )
        child = Child(name, proc, role, mute)
        self.children.append(child)
        child.reader = threading.Thread(target=self._pump, args=(child,), name=f"up-{name}", daemon=True)
        child.reader.start()
        return child

    def _pump(self, child: Child) -> None:
        stdout = child.proc.stdout
        assert stdout is not None, "start() opens every child with stdout=PIPE"
        for raw in iter(stdout.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip()
            if not text:
                continue
            if not any(m in text for m in child.mute):
                self.console.child(child.name, text)
        stdout.close()

    def first_death(self) -> Child | None:
        for child in self.children:
            if not child.alive:
                return child
        return None

    def stop_order(self) -> list[Child]:
        """The apps, then the services they use, the last started first."""
        apps = [c for c in self.children if c.role == "app"]
        return apps + [c for c in reversed(self.children) if c.role == "service"]

    def stop_all(self) -> tuple[list[str], list[str]]:
        """Apps first (they may still be talking to the services), then the services; SIGKILL
        whatever outlives its grace period. SIGTERM goes to the child itself (gunicorn's master
        stops its own workers); SIGKILL goes to its whole process group, strays included."""
        self.stopping = True
        for role, grace in (("app", APP_STOP_GRACE), ("service", SERVICE_STOP_GRACE)):
            group = [c for c in self.stop_order() if c.role == role and c.alive]
            for child in group:
                if child.alive:
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while any(c.alive for c in group) and time.monotonic() < deadline and not self.force:
                time.sleep(0.05)
            for child in group:
                if child.alive and not self.force:
                    self.console.step(f"{child.name} did not stop within {grace:.0f} s; killing it")
                _signal_group(child.proc, signal.SIGKILL)  # also reaps stray grandchildren
        stopped, stuck = [], []
        for child in self.stop_order():
            try:
                child.proc.wait(timeout=REAP_WAIT)
                stopped.append(child.name)
            except subprocess.TimeoutExpired:
                stuck.append(f"{child.name} (pid {child.proc.pid})")
            if child.reader is not None:
                child.reader.join(timeout=READER_JOIN)
        return stopped, stuck


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# Probes ----------------------------------------------------------------------------------------


def port_is_free(port: int, host: str = LOCAL) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers themselves bind: a socket lingering in TIME_WAIT does not count as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOCAL) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def nearby_free_port(port: int) -> int:
    for candidate in range(port + 1, min(port + 50, 65536)):
        if port_is_free(candidate):
            return candidate
    return free_port()


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    from redis.exceptions import RedisError

    try:
        conn = redis_client(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(conn.ping())
        finally:
            conn.close()
    except (RedisError, OSError, ValueError):
        return False


def http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def web_serves(url: str, timeout: float = 1.0) -> bool:
    """The web process serves with its database and Redis: /healthz answers 200, or a 503 whose
    database and Redis are fine (the worker and the scheduler, started alongside, may not have
    left their first heartbeats yet; `up` watches those children itself)."""
    probe = urllib.request.Request(url, headers={"User-Agent": UP_PROBE})  # not in the access log
    try:
        with urllib.request.urlopen(probe, timeout=timeout) as response:
            return response.status == 200
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            return False
        return exc.code == 503 and body.get("database") == "ok" and body.get("redis") == "ok"
    except (OSError, ValueError):
        return False


def wait_until(ready, child: Child, what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if not child.alive:
            raise UpError(f"{what} exited (code {child.proc.returncode}) before it answered; its last lines are above")
        if time.monotonic() > deadline:
            raise UpError(f"{what} did not answer within {timeout:.0f} s")
        time.sleep(0.1)
