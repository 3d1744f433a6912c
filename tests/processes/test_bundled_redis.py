"""The Redis `flask shop up` starts when none answers (shop/devserver/bundled_redis.py): on
loopback only, with a password made for the run that the app, worker and scheduler get in
REDIS_URL; the password is in a file only its owner reads, never on the command line, and `up`
never prints it."""

from __future__ import annotations

import os
import socket
import stat
import subprocess

import pytest
from redis import Redis
from redis.exceptions import RedisError

from process_support import free_port
from shop.devserver.bundled_redis import bundled_redis_server, redis_server_command
from shop.devserver.plan import make_plan, shown_redis_url
from shop.settings import load_settings
from support import wait_until


@pytest.fixture
def bundled(tmp_path):
    """The bundled redis-server started as `up` starts it: (port, password, process)."""
    port, password = free_port(), "run-password-0123456789abcdef"
    command = redis_server_command(bundled_redis_server(), port, str(tmp_path), password)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Redis(host="127.0.0.1", port=port, password=password) as conn:

            def answers() -> bool:
                try:
                    return bool(conn.ping())
                except (RedisError, OSError):  # still starting: connections refused
                    return False

            wait_until(answers, 10, "the bundled redis-server")
        yield port, password, proc
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_bundled_redis_refuses_a_client_without_the_runs_password(bundled):
    port, password, _ = bundled
    # What anyone on this machine can send to a loopback port: a command without AUTH.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as stranger:
        stranger.sendall(b"SET backstop:queue someone-elses-job\r\n")
        assert stranger.recv(200).startswith(b"-NOAUTH")
    with Redis(host="127.0.0.1", port=port, password=password) as shop:
        assert shop.set("k", "v") and shop.get("k") == b"v"


def test_the_bundled_redis_listens_on_loopback_only_and_its_password_is_not_on_its_command_line(bundled, tmp_path):
    port, password, proc = bundled
    with Redis(host="127.0.0.1", port=port, password=password, decode_responses=True) as shop:
        assert shop.config_get("bind")["bind"] == "127.0.0.1"
    with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
        assert password.encode() not in f.read()
    assert stat.S_IMODE(os.stat(tmp_path / "redis.conf").st_mode) == 0o600


def test_up_gives_the_app_worker_and_scheduler_the_bundled_redis_with_its_password_and_never_prints_it(tmp_path):
    nothing_there = free_port()
    environ = {
        "BACKSTOP_INSTANCE_PATH": str(tmp_path / "instance"),
        "STRIPE_API_BASE": "http://127.0.0.1:9",
        "REDIS_URL": f"redis://127.0.0.1:{nothing_there}/3",
    }
    plan = make_plan(free_port(), environ)
    assert plan.start_redis_on == nothing_there and plan.redis_password
    url = plan.env["REDIS_URL"]
    assert url == f"redis://:{plan.redis_password}@127.0.0.1:{nothing_there}/3"
    # Every child of `up` (web, worker, scheduler) is started with plan.env, and reads it so.
    assert load_settings(plan.env, str(tmp_path / "instance"), argv=["flask", "shop", "up"]).redis_url == url
    assert plan.redis_password not in shown_redis_url(url) and plan.redis_password not in " ".join(plan.notes)
    # A second run makes another.
    assert make_plan(free_port(), environ).redis_password != plan.redis_password
