"""The provider guard where it is about processes and threads (payments.guard): the Procfile's
web command (gunicorn, threaded workers) with the provider hanging, and three processes sharing
one rate budget. Real processes against the test database, Redis and a real sandbox, whose
request log says what reached the provider and when."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import requests
from sqlalchemy import select, text
from werkzeug.test import TestResponse

from factories import seed_catalog_rows
from support import wait_until
from payment_helpers import JSON, Shopper
from process_support import ROOT, Processes, free_port, process_env, start_web
from shop.extensions import db
from shop.models import Order
from shop.payments import guard
from shop.stripe_sandbox.testing import peak_in_window


pytestmark = pytest.mark.slow

WEBHOOK_SECRET = "whsec_x"  # process_support.process_env's


def _customer(base: str, skus: dict[str, int]) -> Shopper:
    """One customer over HTTP, with its own cookies and a notebook in its cart."""
    customer = Shopper.over_http(base, skus)
    added = customer.add("NB-A5-DOT")
    assert added.status_code == 303, added.text
    return customer


def _signed_webhook(base: str) -> requests.Response:
    body = json.dumps(
        {
            "id": "evt_unknown_1",
            "object": "event",
            "type": "checkout.session.completed",
            "created": int(time.time()),
            "data": {"object": {"id": "cs_test_unknown", "object": "checkout.session"}},
        }
    ).encode()
    stamp = int(time.time())
    digest = hmac.new(WEBHOOK_SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return requests.post(
        base + "/webhooks/stripe",
        data=body,
        timeout=10,
        headers={"Stripe-Signature": f"t={stamp},v1={digest}", "Content-Type": "application/json"},
    )


def test_with_the_provider_hanging_and_more_checkouts_than_threads_pages_and_the_webhook_answer_within_1s(
    make_fresh_app, sandbox
):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    skus = seed_catalog_rows(app)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs = Processes()
    try:
        # One process of 4 threads: the bulkhead lets 2 of them wait on the provider (5/8) and 1
        # more wait for a slot; one is always free.
        start_web(
            procs,
            process_env(
                app,
                PORT=str(port),
                WEB_CONCURRENCY="1",
                WEB_THREADS="4",
                STRIPE_API_BASE=sandbox.base_url,
                UNPAID_ORDER_EXPIRY_SECONDS="1800",
                RECONCILIATION_STUCK_AGE_SECONDS="1800",
            ),
        )
        wait_until(lambda: _answers(base + "/"), 30, "the web process", procs.logs)
        owner = _customer(base, skus)
        placed = owner.checkout_cart(headers=JSON)
        assert placed.status_code == 303 and "/pay/" in placed.headers["Location"], placed.text
        order_page = placed.get_json()["order_url"]
        shoppers = [_customer(base, skus) for _ in range(8)]

        answers: dict[int, TestResponse] = {}
        with sandbox.api_hanging():
            since = time.time()
            threads = [
                threading.Thread(target=lambda i=i, s=s: answers.__setitem__(i, s.checkout_cart(headers=JSON)))
                for i, s in enumerate(shoppers)
            ]
            for t in threads:
                t.start()
            wait_until(
                lambda: len(sandbox.requests(since=since)) >= 2, 10, "checkouts to reach the hung provider", procs.logs
            )
            time.sleep(0.5)
            for what, ask in (
                ("catalog", lambda: requests.get(base + "/", headers=JSON, timeout=10)),
                ("order page", lambda: owner.client.get(order_page, headers=JSON)),
                ("webhook", lambda: _signed_webhook(base)),
            ):
                started = time.monotonic()
                answer = ask()
                took = time.monotonic() - started
                assert answer.status_code == 200, (what, answer.status_code, answer.text)
                assert took < 1.0, f"the {what} took {took:.2f} s while the provider hung\n{procs.logs()}"
            held = len(sandbox.requests(since=since))
            # A thread waiting on the provider holds no database connection: a transaction left
            # open across the call would keep a pooled connection per waiting checkout, and the
            # pages above would wait for one (the pool is sized for the threads, not for more).
            with app.app_context():
                if db.engine.dialect.name == "postgresql":
                    holding = db.session.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
                        )
                    ).scalar_one()
                    assert holding == 0, f"{holding} connection(s) held in a transaction while the provider hung"
                db.session.remove()
        for t in threads:
            t.join(timeout=30)
        assert held == 2, f"{held} provider calls in flight; the bulkhead allows 2"
        assert sorted(answers) == list(range(8)) and all(a.status_code == 303 for a in answers.values())
        with app.app_context():
            statuses = [s for (s,) in db.session.execute(select(Order.status)).all()]
            db.session.remove()
        assert len(statuses) == 9  # every checkout placed its order, paid or to pay later
    finally:
        procs.stop()


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code < 500
    except requests.RequestException:
        return False


CALLER = r"""
import contextlib, sys, threading, time
from shop import create_app
from shop.payments import gateway, guard

app = create_app()
print("ready", flush=True)
start_at, seconds = float(sys.stdin.readline()), float(sys.argv[1])
customers, background = int(sys.argv[2]), int(sys.argv[3])

def work(kind):
    with app.app_context(), (guard.customer_call() if kind == "customer" else contextlib.nullcontext()):
        time.sleep(max(0.0, start_at - time.time()))
        while time.time() < start_at + seconds:
            try:
                gateway.retrieve_session(f"cs_test_{kind}")
            except (gateway.ProviderRefused, gateway.ProviderUnavailable):  # no such session / not called
                pass
            time.sleep(0.01)

def busy():  # the rest of a web process: pages rendering, holding the GIL between provider calls
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < start_at + seconds:
        sum(i * i for i in range(2000))

kinds = ["customer"] * customers + ["background"] * background
threads = [threading.Thread(target=work, args=(kind,)) for kind in kinds]
threads += [threading.Thread(target=busy) for _ in range(int(sys.argv[4]))]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_three_processes_asking_for_200_calls_a_second_stay_within_the_shared_budget_and_customers_come_first(
    make_fresh_app, sandbox
):
    budget = 20
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    env = process_env(
        app,
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_RATE_LIMIT_PER_SECOND=str(budget),
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    seconds = 3.0
    # 3 processes x 16 threads, each asking again 10 ms after every answer (far over 200 calls a
    # second wanted), beside 2 threads keeping each process busy as pages do, so that threads
    # wait their turn for the GIL between reading the clock and reaching Redis. Every sliding
    # second of the sandbox's request timestamps counts, not calendar seconds.
    children, start_at = _callers(CALLER, env, [repr(seconds), "12", "4", "2"])
    _finish(children)

    everything = sandbox.requests(since=start_at - 1)
    calls = [c for c in everything if c["at"] < start_at + seconds]
    made = {kind: sum(1 for c in calls if c["path"].endswith(kind)) for kind in ("customer", "background")}
    times = sorted(c["at"] for c in calls)
    assert len(times) >= budget, f"only {len(times)} calls made: the budget went unused"
    assert peak_in_window(times, 1.0) <= budget, f"{peak_in_window(times, 1.0)} calls in one second at the provider"
    assert made["customer"] > 2 * made["background"], f"the background callers did not yield: {made}"


def _callers(script: str, env: dict, args: list[str], count: int = 3) -> tuple[list, float]:
    """`count` processes running `script` with `args`, each started when all are ready; returns
    them and the common start time (epoch seconds)."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args],
            cwd=ROOT,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(count)
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
        start_at = time.time() + 0.5
        for child in children:
            child.stdin.write(f"{start_at!r}\n")
            child.stdin.flush()
    except BaseException:
        _finish(children, timeout=1)
        raise
    return children, start_at


def _finish(children, timeout: float = 120) -> None:
    try:
        for child in children:
            _out, err = child.communicate(timeout=timeout)
            assert child.returncode == 0, err
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_with_three_processes_one_probe_a_second_finds_the_provider_back_and_closes_the_breaker_within_2s(
    make_fresh_app, sandbox
):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    env = process_env(
        app,
        STRIPE_API_BASE=sandbox.base_url,
        BACKSTOP_STRIPE_BREAKER_THRESHOLD="3",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    outage, after = 5.0, 3.0
    sandbox.faults(api_unavailable=True)
    # Three processes whose customers keep asking (every 50 ms each): each sees the breaker open
    # and starts a prober; the shared claim lets one probe go a second, whoever holds it.
    children, start_at = _callers(CALLER, env, [repr(outage + after), "4", "0", "0"])
    try:
        time.sleep(max(0.0, start_at + outage - time.time()))
        sandbox.faults(api_unavailable=False)
        back = time.time()
        with app.app_context():
            provider_guard = guard.get()
            while provider_guard.breaker_view()["state"] != guard.CLOSED:
                assert time.time() - back < 2.0, "the breaker was still open 2 s after the provider came back"
                time.sleep(0.05)
            closed = time.time()
            view = provider_guard.breaker_view()
    finally:
        _finish(children)
    calls = sandbox.requests(since=start_at - 1)
    probes = sorted(c["at"] for c in calls if c["path"] == "/v1/events" and c["at"] <= closed)
    customers = [c for c in calls if c["path"].startswith("/v1/checkout/sessions/")]
    assert len(probes) >= 3, f"{len(probes)} probes during a {outage} s outage"
    assert peak_in_window(probes, 1.0) == 1, f"probes less than a second apart: {probes}"
    answered = min(c["at"] for c in calls if c["path"] == "/v1/events" and c["status"] == 200)
    assert not [c for c in customers if probes[0] < c["at"] < answered], "a customer's call was made while probing"
    assert any(c["at"] > closed and c["status"] == 404 for c in customers), "customers' calls did not resume"
    assert view["transitions"][guard.CLOSED] == 1 and view["transitions"][guard.OPEN] >= 1


def test_three_processes_never_send_one_endpoint_more_than_its_budget_and_each_endpoint_has_its_own(
    make_fresh_app, sandbox
):
    budget = 10
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    env = process_env(
        app,
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_RATE_LIMIT_PER_SECOND="1000",
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=str(budget),
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    seconds = 3.0
    # 3 processes x (8 threads reading sessions + 4 listing events), each asking again 10 ms
    # after every answer, beside 2 busy threads each: far over 10 calls a second per endpoint.
    children, start_at = _callers(ENDPOINT_CALLER, env, [repr(seconds), "8", "4", "2"])
    _finish(children)
    calls = [c for c in sandbox.requests(since=start_at - 1) if c["at"] < start_at + seconds]
    by_endpoint: dict[str, list[float]] = {}
    for c in calls:
        by_endpoint.setdefault(c["endpoint"], []).append(c["at"])
    assert set(by_endpoint) == {"GET /v1/checkout/sessions/{id}", "GET /v1/events"}, set(by_endpoint)
    for endpoint, times in by_endpoint.items():
        times.sort()
        assert len(times) >= budget * seconds * 0.6, f"{endpoint}: only {len(times)} calls; the budget went unused"
        assert peak_in_window(times, 1.0) <= budget, f"{endpoint}: {peak_in_window(times, 1.0)} calls in one second"
    assert peak_in_window(sorted(c["at"] for c in calls), 1.0) > budget, (
        "the endpoints did not have budgets of their own"
    )


ENDPOINT_CALLER = r"""
import sys, threading, time
from shop import create_app
from shop.payments import gateway, guard

app = create_app()
print("ready", flush=True)
start_at, seconds = float(sys.stdin.readline()), float(sys.argv[1])

def work(call):
    with app.app_context(), guard.customer_call(30):
        time.sleep(max(0.0, start_at - time.time()))
        while time.time() < start_at + seconds:
            try:
                call()
            except (gateway.ProviderRefused, gateway.ProviderUnavailable):
                pass
            time.sleep(0.01)

read = lambda: gateway.retrieve_session("cs_test_nothing")
listing = lambda: gateway._call("list events", lambda: gateway.client().v1.events.list(params={"limit": 1}))

def busy():
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < start_at + seconds:
        sum(i * i for i in range(2000))

threads = [threading.Thread(target=work, args=(read,)) for _ in range(int(sys.argv[2]))]
threads += [threading.Thread(target=work, args=(listing,)) for _ in range(int(sys.argv[3]))]
threads += [threading.Thread(target=busy) for _ in range(int(sys.argv[4]))]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""
