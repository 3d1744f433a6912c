"""The front holds against one client (deploy/nginx.conf; docs/REFERENCE.md, Routes, Conventions:
the front's limits): more idle connections from one address than nginx has room for crowd out
neither health probes nor other clients (nginx has no more connections than open files, so it
closes idle ones rather than stop accepting); a burst on an expensive route from one address is
answered 429 by nginx, in words, while every other address is served; and behind a load balancer the front and the app
count each client by the address the trusted balancer names (`TRUSTED_PROXIES`), never by the
balancer's own nor by one a client claims. Real processes: the Procfile's web line (nginx before
gunicorn), Debian's nginx again as the balancer, the test database and Redis. Clients connect
from 127.0.0.2 and 127.0.0.3 (every 127/8 address is this machine's)."""

from __future__ import annotations

import http.client
import time

import pytest

from process_support import IdleConnections, Processes, free_port, start_balancer, web_behind_front
from shop.devserver.front import FrontError, nginx_binary, worker_connections
from support import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (apt-get install nginx-light)"),
]

A, B = "127.0.0.2", "127.0.0.3"
RETURN = "/checkout/return?order=NOPE&session_id=cs_test_nope"
BURST = 50


def _ask(port: int, source: str, method: str, path: str, claimed: str | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    headers = {"Accept": "application/json"}
    if claimed:
        headers["X-Forwarded-For"] = claimed
    conn.request(method, path, body=b"" if method == "POST" else None, headers=headers)
    answer = conn.getresponse()
    answer.read()
    conn.close()
    return answer


def _status(port: int, source: str, method: str, path: str, claimed: str | None = None) -> int:
    return _ask(port, source, method, path, claimed).status


def _checkout_burst(port: int, source: str) -> tuple[list[int], float]:
    """POST /checkout as fast as one client can: without a CSRF token the app refuses each (400),
    so only the front's limit can answer 429. With the seconds the burst took."""
    started = time.monotonic()
    statuses = [_status(port, source, "POST", "/checkout") for _ in range(BURST)]
    return statuses, time.monotonic() - started


def _assert_burst_cut(burst: tuple[list[int], float]) -> None:
    # 30 at once (the burst: an office behind one address checking out together), and one a
    # second after (60 a minute), however long the burst took on a loaded machine: the rest is
    # refused by the front.
    statuses, seconds = burst
    admitted = 30 + int(seconds) + 1
    assert statuses[:30] == [400] * 30, statuses
    assert statuses.count(400) <= admitted and set(statuses) == {400, 429}, (statuses, seconds)


def test_a_checkout_burst_from_one_address_is_refused_by_the_front_while_another_address_is_served(
    make_fresh_app,
):
    app = make_fresh_app()
    port = free_port()
    procs = Processes()
    try:
        web_behind_front(procs, app, port)
        burst = _checkout_burst(port, A)
        refusal = _ask(port, A, "POST", "/checkout")
        other, health = _status(port, B, "POST", "/checkout"), _status(port, A, "GET", "/healthz")
        logs = procs.logs()
    finally:
        procs.stop()
    _assert_burst_cut(burst)
    assert refusal.status == 429 and refusal.getheader("Retry-After") == "60", logs
    # Served, not held back: the app's own answers (its 400 for a checkout without a token, the
    # health page), past a front that refuses a burst's excess at once (a 429, never a delay).
    assert other == 400 and health in (200, 503), (other, health)


# The balancer connects to the shop from 127.0.0.1: trusted as that network, or as the one hop
# before the shop (as a platform's router is).
@pytest.mark.parametrize("trusted", ["127.0.0.1", "1"])
def test_behind_a_trusted_balancer_the_front_and_the_app_count_each_client_by_its_own_address(make_fresh_app, trusted):
    app = make_fresh_app()
    port, shop_port = free_port(), free_port()
    procs = Processes()
    try:
        web_behind_front(procs, app, shop_port, TRUSTED_PROXIES=trusted, CHECKOUT_RETURN_PER_MINUTE="3")
        start_balancer(procs, port, shop_port)
        wait_until(lambda: _answers_via(port), 10, "the balancer to pass requests on", procs.logs)
        a_pages = [_status(port, A, "GET", RETURN) for _ in range(4)]
        # A claims to be B: the balancer appends A's address after the claim, and only it counts.
        a_claiming_b = _status(port, A, "GET", RETURN, claimed=B)
        b_pages = [_status(port, B, "GET", RETURN) for _ in range(3)]
        logs = procs.logs()  # before the burst's lines, which would crowd the throttle's out
        a_burst = _checkout_burst(port, A)
        b_checkout = _status(port, B, "POST", "/checkout")
    finally:
        procs.stop()
    assert a_pages == [404, 404, 404, 429] and a_claiming_b == 429, (a_pages, a_claiming_b)
    assert b_pages == [404, 404, 404], b_pages
    _assert_burst_cut(a_burst)
    assert b_checkout == 400
    # The app's words name the client, never the balancer.
    assert f"checkout return throttled from {A}" in logs and "throttled from 127.0.0.1" not in logs, logs


def _answers_via(port: int) -> bool:
    try:
        return _status(port, B, "GET", "/healthz") in (200, 503)
    except OSError:
        return False


# A small host's open-file limit for the web, and more idle connections from one address than
# nginx then has: the worker_connections it is given are at most this less SPARE_FILES.
OPEN_FILES = 512
IDLE = 700
# nginx's words when it closes idle connections to make room (ngx_drain_connections), and the
# accept failure it would meet with more connections than open files.
REUSING = "worker_connections are not enough, reusing connections"
OUT_OF_FILES = "Too many open files"
PROBING_SECONDS = 12.0  # past two of nginx's 5 s header timeouts: idle connections renewed twice


def _answered(port: int, source: str, path: str) -> bool:
    try:
        return _status(port, source, "GET", path) in (200, 503)
    except OSError:
        return False


def test_more_idle_connections_from_one_address_than_the_front_holds_crowd_out_neither_health_nor_another_client(
    make_fresh_app,
):
    app = make_fresh_app()
    port = free_port()
    procs = Processes()
    health, other = [], []
    try:
        web_behind_front(procs, app, port, open_files=OPEN_FILES)
        with IdleConnections("127.0.0.1", port, count=IDLE, source=A) as idle:
            wait_until(lambda: idle.held >= IDLE, 20, "the idle connections to open", procs.logs)
            until = time.monotonic() + PROBING_SECONDS
            while time.monotonic() < until:
                health.append(_answered(port, B, "/healthz"))
                other.append(_answered(port, B, "/"))
                time.sleep(0.2)  # a probe's pace, not a wait on a condition
            held, reopened = idle.held, idle.reopened
        logs = procs.logs()
    finally:
        procs.stop()
    answered = f"health answered {sum(health)} of {len(health)}, the page {sum(other)} of {len(other)}"
    summary = f"{held} idle held, {reopened} reopened; {answered}"
    print(summary)
    assert held >= IDLE * 0.9 and reopened > 0, summary  # the front was really full of them
    assert all(health) and all(other), f"{summary}\n{logs}"
    # Room made at once, not after an idle one's header timeout: nginx closed idle connections for
    # the new ones (its warning) and never ran out of files to accept them with.
    assert REUSING in logs and OUT_OF_FILES not in logs, logs


def test_nginx_gets_no_more_connections_than_files_for_them_and_too_few_files_is_refused_in_words():
    assert worker_connections(100_000) == 4096
    assert worker_connections(OPEN_FILES) == OPEN_FILES - 32
    with pytest.raises(FrontError, match=r"the open-file limit \(90\) leaves nginx fewer than 64 connections"):
        worker_connections(90)
