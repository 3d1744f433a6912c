"""The provider guard where it is about processes and threads (provider.guard): the Procfile's
web command (gunicorn, threaded workers) with the provider hanging, and three processes sharing
one rate budget. Real processes against the test database, Redis and a real sandbox, whose
request log says what reached the provider and when."""

from __future__ import annotations

import contextlib
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
from payment_helpers import JSON, Shopper
from process_support import ROOT, Processes, free_port, process_env, stalled, start_web
from shop.extensions import db
from shop.models import Order
from shop.provider import guard
from shop.stripe_sandbox.testing import peak_in_window
from support import wait_until

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


def test_with_the_provider_hanging_and_more_checkouts_than_threads_pages_and_the_webhook_answer_on_the_free_thread(
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

            def orders_placed() -> int:
                with app.app_context():
                    count = db.session.query(Order).count()
                    db.session.remove()
                return count == 9  # the owner's and each of the eight checkouts' (its order comes first)

            wait_until(orders_placed, 10, "every checkout's order placed", procs.logs)
            # The bulkhead refused the checkouts past its 2 calls and 1 wait (each offered "Pay
            # now"): only the 2 at the provider are still waiting, and a thread is free.
            wait_until(lambda: len(answers) == 6, 10, "the checkouts past the bulkhead answered", procs.logs)
            for what, ask in (
                ("catalog", lambda: requests.get(base + "/", headers=JSON, timeout=10)),
                ("order page", lambda: owner.client.get(order_page, headers=JSON)),
                ("webhook", lambda: _signed_webhook(base)),
            ):
                answer = ask()
                assert answer.status_code == 200, (what, answer.status_code, answer.text)
                # Answered on the free thread, not on one a held checkout gave back: both still wait.
                assert len(answers) == 6, f"the {what} was answered after a held checkout\n{procs.logs()}"
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
from shop.provider import gateway, guard

app = create_app()
print("ready", flush=True)
start_at, seconds = float(sys.stdin.readline()), float(sys.argv[1])
customers, background = int(sys.argv[2]), int(sys.argv[3])
stop = threading.Event()  # a line "stop" ends the callers before their seconds are over

def told_to_stop():
    if sys.stdin.readline().strip() == "stop":
        stop.set()

threading.Thread(target=told_to_stop, daemon=True).start()

def going():
    return time.time() < start_at + seconds and not stop.is_set()

def work(kind):
    with app.app_context(), (guard.customer_call() if kind == "customer" else contextlib.nullcontext()):
        time.sleep(max(0.0, start_at - time.time()))
        while going():
            try:
                gateway.retrieve_session(f"cs_test_{kind}")
            except (gateway.ProviderRefused, gateway.ProviderUnavailable):  # no such session / not called
                pass
            time.sleep(0.01)

def busy():  # the rest of a web process: pages rendering, holding the GIL between provider calls
    time.sleep(max(0.0, start_at - time.time()))
    while going():
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


def _stop(children) -> None:
    """Tell CALLER children to end now."""
    for child in children:
        with contextlib.suppress(OSError):
            child.stdin.write("stop\n")
            child.stdin.flush()


def _finish(children, timeout: float = 120) -> list[str]:
    """Wait for every child to end, each successfully; returns what each printed after "ready"."""
    outputs = []
    try:
        for child in children:
            out, err = child.communicate(timeout=timeout)
            assert child.returncode == 0, err
            outputs.append(out)
        return outputs
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_with_three_processes_one_probe_a_second_finds_the_provider_back_and_its_first_answer_closes_the_breaker(
    make_fresh_app, sandbox
):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    env = process_env(
        app,
        STRIPE_API_BASE=sandbox.base_url,
        BACKSTOP_STRIPE_BREAKER_THRESHOLD="3",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    outage = 5.0
    sandbox.faults(api_unavailable=True)
    # Three processes whose customers keep asking (every 50 ms each): each sees the breaker open
    # and starts a prober; the shared claim lets one probe go a second, whoever holds it. They go
    # on until the breaker has closed and a customer's call followed (then told to stop; the
    # minute is only a backstop): a prober lives as long as its process, so processes that ended
    # at a fixed time could leave the breaker open with no one left to probe on a loaded machine.
    children, start_at = _callers(CALLER, env, [repr(outage + 60), "4", "0", "0"])
    try:
        time.sleep(max(0.0, start_at + outage - time.time()))  # a sleep: the outage's length is the fault
        sandbox.faults(api_unavailable=False)
        with app.app_context():
            provider_guard = guard.get()
            # Within 2 s of the return because a probe goes every second and the first that finds
            # the provider answering closes the breaker (asserted below): not timed here.
            wait_until(
                lambda: provider_guard.breaker_view()["state"] == guard.CLOSED,
                timeout=15,
                what="the breaker to close after the provider's return",
            )
            closed = time.time()
            view = provider_guard.breaker_view()
        wait_until(
            lambda: any(
                c["path"].startswith("/v1/checkout/sessions/") and c["at"] > closed
                for c in sandbox.requests(since=closed - 1)
            ),
            timeout=15,
            what="a customer's call after the breaker closed",
        )
    finally:
        _stop(children)
        _finish(children)
    calls = sandbox.requests(since=start_at - 1)
    probes = sorted(c["at"] for c in calls if c["path"] == "/v1/events" and c["at"] <= closed)
    customers = [c for c in calls if c["path"].startswith("/v1/checkout/sessions/")]
    assert len(probes) >= 3, f"{len(probes)} probes during a {outage} s outage"
    # One probe a second for the three processes together, claimed in Redis: counted, not spaced
    # pairwise, since each claimed probe reaches the provider after a delay a loaded machine
    # varies (two claimed 1.0 s apart arrived 0.96 s apart); one spacing of slack for the first's
    # and the last's delays. Each process probing on its own would make about three times as many.
    spacing = guard.PROBE_SPACING_SECONDS
    allowed = (probes[-1] - probes[0] + spacing) / spacing + 1
    assert len(probes) <= allowed, f"more than one probe a second: {probes}"
    answered = min(c["at"] for c in calls if c["path"] == "/v1/events" and c["status"] == 200)
    assert not [p for p in probes if answered < p], f"probes after the first that was answered: {probes}"
    assert not [c for c in customers if probes[0] < c["at"] < answered], "a customer's call was made while probing"
    assert any(c["at"] > closed and c["status"] == 404 for c in customers), "customers' calls did not resume"
    assert view["transitions"][guard.CLOSED] == 1 and view["transitions"][guard.OPEN] >= 1


def test_three_processes_bursting_checkouts_with_one_stalled_for_2s_every_customer_gets_a_session(
    make_fresh_app, sandbox
):
    """The worst case of the shop's own burst: three processes' customers keep creating checkout
    sessions, paced by the shared endpoint budget, and the sandbox holds the shop to the same
    limit as Stripe would (a 429 beyond it). For 2 s mid-burst one process is stalled (SIGSTOP)
    and the way to the provider stalls too, so requests paced right when they were written
    arrive together, over the limit: whatever the provider refused that way is retried within
    the customer's request budget, and no customer sees a failure (docs/REFERENCE.md, Settings:
    STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND)."""
    budget = 10
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    env = process_env(
        app,
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_RATE_LIMIT_PER_SECOND="1000",
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=str(budget),
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    sandbox.faults(api_endpoint_rate_limit_per_second=budget)
    seconds, stall = 4.0, 2.0
    # 3 processes x 6 customer threads, each starting a new checkout 10 ms after the last one's
    # answer (far over 10 sessions a second), beside 2 busy threads each.
    children, start_at = _callers(BURST_CALLER, env, [repr(seconds), "6", "2"])
    try:
        wait_until(lambda: len(_session_calls(sandbox, start_at)) >= budget, 30, "the burst to reach the provider")
        # A caller stalled by itself bunches nothing: its grants are confirmed as its requests
        # are written. The stall that does is on the way, after the write: the provider's door
        # holds what arrives meanwhile and counts it at once when it opens again.
        with sandbox.api_hanging():
            stalled(children[0], stall)
    finally:
        outputs = _finish(children)
    customers = [json.loads(line) for out in outputs for line in out.splitlines() if line.startswith("{")]
    calls = _session_calls(sandbox, start_at)
    refused = [c for c in calls if c["status"] == 429]
    peak = peak_in_window(sorted(c["at"] for c in calls), 1.0)
    seen = f"{len(calls)} calls reached the provider, {len(refused)} answered 429; at most {peak} arrived in one second"
    print(f"\n{len(customers)} customers; {seen}")
    failed = [c for c in customers if not c.get("session")]
    assert not failed, f"{len(failed)} of {len(customers)} customers got no session ({seen}): {failed[:5]}"
    assert len(customers) >= budget * seconds * 0.5, f"only {len(customers)} checkouts: the budget went unused"
    assert len({c["session"] for c in customers}) == len(customers), "two customers were given one session"


def _session_calls(sandbox, since: float) -> list[dict]:
    return [c for c in sandbox.requests(since=since - 1) if c["endpoint"] == "POST /v1/checkout/sessions"]


BURST_CALLER = r"""
import json, sys, threading, time
from collections import namedtuple
from datetime import datetime, timedelta, timezone
from shop import create_app
from shop.provider import gateway, guard

app = create_app()
# A customer waits for the shop's own budget for the whole of its request, as an order in line
# waits for the payment queue: a customer left without a session is one the provider refused.
app.config["STRIPE_CUSTOMER_WAIT_SECONDS"] = app.config["STRIPE_REQUEST_BUDGET_SECONDS"]
print("ready", flush=True)
start_at, seconds = float(sys.stdin.readline()), float(sys.argv[1])
Line = namedtuple("Line", "quantity unit_price name sku")
lock, outcomes = threading.Lock(), []

def checkout(number):
    began = time.monotonic()
    with app.app_context(), guard.customer_call():
        try:
            view = gateway.create_checkout_session(
                order_id=number, reference=f"BURST-{number}", attempt=1, lines=[Line(1, 700, "Pen", "PEN")],
                currency="usd", email="burst@example.com", success_url="http://shop.test/ok",
                cancel_url="http://shop.test/cancel", expires_at=datetime.now(timezone.utc) + timedelta(hours=1),
            )
            outcome = {"session": view.id}
        except Exception as exc:  # what the customer would have got instead of a payment page
            outcome = {"error": f"{type(exc).__name__}: {exc}", "kind": str(getattr(exc, "kind", ""))}
    outcome.update(customer=number, seconds=round(time.monotonic() - began, 2))
    with lock:
        outcomes.append(outcome)

def work(thread):
    time.sleep(max(0.0, start_at - time.time()))
    for i in range(100000):
        if time.time() >= start_at + seconds:
            break
        checkout(threading.get_native_id() * 100000 + i)
        time.sleep(0.01)

def busy():
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < start_at + seconds:
        sum(i * i for i in range(2000))

threads = [threading.Thread(target=work, args=(t,)) for t in range(int(sys.argv[2]))]
threads += [threading.Thread(target=busy) for _ in range(int(sys.argv[3]))]
for t in threads:
    t.start()
for t in threads:
    t.join()
for outcome in outcomes:
    print(json.dumps(outcome))
"""
