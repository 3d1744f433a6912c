"""The web's front (docs/REFERENCE.md, Commands: `flask shop web`): the Procfile's web line, run
as a deployment runs it, puts nginx before gunicorn's threads. Slow clients do not hold the
threads, the per-address limits see each client's own address and no client can claim
another's, and the command stops both servers together. Real processes against the test
database, Redis and a real sandbox. Needs nginx (Debian's nginx-light; scripts/test installs it).

That the slow-client test means something was checked by running it against gunicorn alone
(`WEB_FRONT=none`, which the test's processes inherit from the environment): it fails there."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import threading
import time

import pytest
import requests

from factories import DEFAULT_SKU, seed_catalog_rows
from payment_helpers import Shopper
from process_support import (
    ConnectionsTo,
    Processes,
    Tricklers,
    catalog_answers,
    free_port,
    process_env,
    start_web,
    web_behind_front,
)
from shop.devserver.front import nginx_binary
from support import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (apt-get install nginx-light)"),
]

SLOW_CLIENTS = 200
TRICKLE_SECONDS = 30.0
GUNICORN_THREADS = 64  # the Procfile's defaults: 2 processes x 32 threads
GUNICORN_AT = re.compile(r"hands it to gunicorn on 127\.0\.0\.1:(\d+)")
CHECKOUTS = 6


def test_200_slow_clients_for_30s_hold_no_gunicorn_connection_the_catalog_and_every_checkout_answer(
    make_fresh_app, sandbox
):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    skus = seed_catalog_rows(app)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs = Processes()
    checkouts: list = []

    def check_out_now_and_then():
        # Whole journeys while the slow clients are connected: the catalog page, the cart, the
        # checkout (which asks the provider for its session), one every few seconds.
        for _ in range(CHECKOUTS):
            try:
                answer = Shopper.over_http(base, skus).checkout(DEFAULT_SKU)
                checkouts.append((answer.status_code, answer.headers.get("Location", "")))
            except requests.RequestException as exc:
                checkouts.append((None, repr(exc)))
            time.sleep(TRICKLE_SECONDS / (CHECKOUTS + 2))

    try:
        # The Procfile's defaults (2 processes x 32 threads): 200 slow clients outnumber them.
        web_behind_front(procs, app, port, STRIPE_API_BASE=sandbox.base_url)
        gunicorn = int(GUNICORN_AT.search(procs.logs()).group(1))  # pyright: ignore[reportOptionalMemberAccess]
        with Tricklers("127.0.0.1", port, count=SLOW_CLIENTS, gap=3.0) as slow:
            wait_until(lambda: slow.connected == SLOW_CLIENTS, 10, "the slow clients to connect", procs.logs)
            with ConnectionsTo(gunicorn) as to_gunicorn:
                buyer = threading.Thread(target=check_out_now_and_then)
                buyer.start()
                answers = catalog_answers(base, TRICKLE_SECONDS)
                buyer.join(timeout=120)
            held, dropped = slow.connected, slow.dropped
    finally:
        procs.stop()

    summary = (
        f"{sum(answers)} of {len(answers)} catalog requests answered; at most {to_gunicorn.most} connections to "
        f"gunicorn; {held} slow clients connected at the end ({dropped} dropped and reconnected)"
    )
    print(summary)
    assert held >= SLOW_CLIENTS * 0.9, summary
    assert len(answers) >= 100 and all(answers), summary
    # What keeps the threads free: nginx hands gunicorn a request only once it has all of it, so
    # the slow clients' connections end at nginx, and gunicorn sees the few whole requests at a
    # time, never one connection per slow client (its threads: 2 processes x 32).
    assert to_gunicorn.most < GUNICORN_THREADS, summary
    assert len(checkouts) == CHECKOUTS, checkouts
    assert all(status == 303 and "/pay/" in where for status, where in checkouts), checkouts


def _return_page(port: int, source: str, claimed: str | None) -> int:
    """GET /checkout/return from the local address `source`, claiming to be `claimed`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        headers = {"Accept": "application/json"}
        if claimed:
            headers["X-Forwarded-For"] = claimed
        conn.request("GET", "/checkout/return?order=NOPE&session_id=cs_test_nope", headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_behind_the_front_each_client_has_its_own_address_and_none_can_claim_another(make_fresh_app, sandbox):
    """Two clients on two addresses (127.0.0.2 and 127.0.0.3: every 127/8 address is this
    machine's) and the return page's per-address limit of 3 a minute. Through nginx, gunicorn
    sees every request come from 127.0.0.1: the app must count each client's own address, and
    an X-Forwarded-For a client sends (another's address, or any) must change nothing."""
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    port = free_port()
    procs = Processes()
    a, b = "127.0.0.2", "127.0.0.3"
    try:
        web_behind_front(procs, app, port, STRIPE_API_BASE=sandbox.base_url, CHECKOUT_RETURN_PER_MINUTE="3")
        first_of_b = _return_page(port, b, None)
        # A spends its 3 while claiming to be B, then claims to be someone new.
        a_claiming_b = [_return_page(port, a, b) for _ in range(3)]
        a_claiming_new = _return_page(port, a, "203.0.113.7")
        a_claiming_list = _return_page(port, a, "203.0.113.8, 198.51.100.9")
        # B has used 1 of its 3: A's requests were not counted as B's.
        rest_of_b = [_return_page(port, b, None) for _ in range(2)]
        b_over = _return_page(port, b, "203.0.113.9")
        logs = procs.logs()
    finally:
        procs.stop()
    assert first_of_b == 404 and a_claiming_b == [404, 404, 404], (first_of_b, a_claiming_b)
    assert (a_claiming_new, a_claiming_list) == (429, 429)
    assert rest_of_b == [404, 404] and b_over == 429, (rest_of_b, b_over)
    # The app's own words name the client, not nginx and not what the client claimed.
    assert f"checkout return throttled from {a}" in logs, logs
    assert f"checkout return throttled from {b}" in logs, logs
    assert "throttled from 127.0.0.1" not in logs and "throttled from 203.0.113" not in logs, logs


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _gone(pids: list[int]) -> bool:
    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    return not any(alive(p) for p in pids)


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_the_web_command_stops_both_servers_on_sigterm_and_when_either_dies(make_fresh_app):
    app = make_fresh_app()
    procs = Processes()
    try:
        # SIGTERM to the command alone (as a process manager sends it): both stop, exit 0.
        port = free_port()
        web = web_behind_front(procs, app, port)
        started = _children(web.pid)
        assert {"nginx", "gunicorn"} <= {w for p in started for w in ("nginx", "gunicorn") if w in _cmdline(p)}
        web.send_signal(signal.SIGTERM)
        assert web.wait(timeout=60) == 0, procs.logs()
        wait_until(lambda: _gone(started), 10, "nginx and gunicorn to stop", procs.logs)
        assert not _port_answers(port)

        # gunicorn dies: nginx is stopped and the command exits non-zero, saying so.
        port = free_port()
        web = web_behind_front(procs, app, port)
        started = _children(web.pid)
        gunicorn = next(p for p in started if "gunicorn" in _cmdline(p))
        os.kill(gunicorn, signal.SIGKILL)
        assert web.wait(timeout=30) != 0
        wait_until(lambda: _gone(started), 10, "nginx to stop", procs.logs)
        assert "gunicorn exited (code -9); stopping the other" in procs.logs()
        assert not _port_answers(port)
    finally:
        procs.stop()


def test_without_nginx_the_web_command_refuses_in_one_line_unless_told_to_run_gunicorn_alone(make_fresh_app):
    app = make_fresh_app()
    procs = Processes()
    try:
        port = free_port()
        env = process_env(app, PORT=str(port), BACKSTOP_NGINX="/nonexistent/nginx")
        web = start_web(procs, env)
        assert web.wait(timeout=60) == 3
        lines = [line for line in procs.logs().splitlines() if line.strip() and not line.startswith("---")]
        assert lines == [
            "backstop web: BACKSTOP_NGINX=/nonexistent/nginx is not an executable file; refusing to serve "
            "without it (WEB_FRONT=none runs gunicorn alone)"
        ], lines
    finally:
        procs.stop()


def test_the_procfile_names_gunicorns_threaded_workers_and_a_server_that_binds_itself_is_refused():
    """The web line says what serves: gunicorn's threaded workers (a checkout waiting on the
    provider holds a thread, not a process), given to `flask shop web`, which binds it itself."""
    from shop.devserver.front import FrontError, given_server

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "Procfile")) as f:
        web = next(line for line in f if line.startswith("web:"))
    assert "shop web -- gunicorn app:app --worker-class gthread" in web and "--threads" in web
    argv = given_server(["gunicorn", "app:app", "--worker-class", "gthread"], "fd://5")
    assert argv[1:3] == ["-m", "gunicorn"] and argv[-2:] == ["--bind", "fd://5"]
    with pytest.raises(FrontError):
        given_server(["gunicorn", "app:app", "--bind", "0.0.0.0:80"], "fd://5")
