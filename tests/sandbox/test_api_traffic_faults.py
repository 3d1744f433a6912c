"""The /v1 traffic faults (latency, hang, rate limit) and the request log, through the real SDK.

Only lower bounds on time are asserted; "does not answer" is a client timeout, a fact about
the protocol rather than about speed.
"""

import math
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import stripe

from shop.stripe_sandbox import traffic
from shop.stripe_sandbox.testing import SandboxControlError, peak_in_window, wait_until
from shop.stripe_sandbox.traffic import RequestLog


def new_session(client):
    return client.v1.checkout.sessions.create(
        params={
            "mode": "payment",
            "success_url": "http://shop.test/ok",
            "line_items": [
                {
                    "price_data": {"currency": "usd", "unit_amount": 700, "product_data": {"name": "Pen"}},
                    "quantity": 1,
                }
            ],
        }
    )


def impatient_client(sandbox, timeout: float):
    """An SDK client that gives up after `timeout` seconds and never retries."""
    return stripe.StripeClient(
        "sk_test_sandbox",
        base_addresses={"api": sandbox.base_url},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=timeout),
    )


class InBackground:
    """Run one call on a thread; `result()` waits for it and re-raises what it raised."""

    def __init__(self, call):
        self._outcome: dict = {}
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call):
        try:
            self._outcome["value"] = call()
        except BaseException as error:  # handed to the test thread
            self._outcome["error"] = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the call was still held after {timeout}s"
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def held_calls(sandbox) -> list[dict]:
    return [c for c in sandbox.requests() if c["status"] is None]


# -- latency -------------------------------------------------------------------------


def test_api_latency_holds_every_v1_call_at_least_that_long(client, sandbox):
    session = new_session(client)
    sandbox.faults(api_latency_seconds=0.4, api_latency_jitter_seconds=0.2)

    for call in (lambda: client.v1.checkout.sessions.retrieve(session.id), lambda: new_session(client)):
        started = time.monotonic()
        call()
        assert time.monotonic() - started >= 0.4


def test_lowering_the_latency_releases_calls_already_waiting(client, sandbox):
    session = new_session(client)
    sandbox.faults(api_latency_seconds=60)
    waiting = InBackground(lambda: client.v1.checkout.sessions.retrieve(session.id))
    wait_until(lambda: held_calls(sandbox), what="the call to arrive")

    sandbox.faults(api_latency_seconds=0)

    assert waiting.result(timeout=10).id == session.id


# -- hang ----------------------------------------------------------------------------


def test_a_hung_api_leaves_the_hosted_page_and_control_routes_answering(client, sandbox):
    session = new_session(client)
    with sandbox.api_hanging():
        with pytest.raises(stripe.APIConnectionError):
            impatient_client(sandbox, 0.5).v1.checkout.sessions.retrieve(session.id)
        hung = InBackground(lambda: client.v1.checkout.sessions.retrieve(session.id))
        wait_until(lambda: len(held_calls(sandbox)) == 2, what="two held calls")

        # Served while two /v1 calls are held inside the server.
        assert sandbox.events() == []
        assert sandbox.faults()["api_hang"] is True
        with urllib.request.urlopen(sandbox.pay_page_url(session.id), timeout=5) as page:
            assert page.status == 200
        assert sandbox.set_outcome(session.id, "paid")["payment_status"] == "paid"
        assert not hung.done()

    assert hung.result(timeout=10).payment_status == "paid"


def test_a_reset_releases_hung_calls(client, sandbox):
    sandbox.faults(api_hang=True)
    hung = InBackground(lambda: client.v1.checkout.sessions.list())
    wait_until(lambda: held_calls(sandbox), what="the call to arrive")

    sandbox.reset()

    assert hung.result(timeout=10).data == []


def test_a_hang_never_holds_a_call_past_the_maximum(client, sandbox, monkeypatch):
    monkeypatch.setattr(traffic, "MAX_API_HOLD_SECONDS", 0.5)
    sandbox.faults(api_hang=True)
    started = time.monotonic()

    assert client.v1.checkout.sessions.list().data == []
    assert time.monotonic() - started >= 0.5
    assert sandbox.faults()["api_hang"] is True


# -- rate limit ----------------------------------------------------------------------


def test_calls_beyond_the_rate_limit_get_stripes_429(client, sandbox):
    limit = 5
    sandbox.faults(api_rate_limit_per_second=limit)

    def attempt():
        try:
            client.v1.checkout.sessions.list()
            return None
        except stripe.RateLimitError as error:
            return error

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=3 * limit) as pool:
        outcomes = list(pool.map(lambda _: attempt(), range(3 * limit)))
    elapsed = time.monotonic() - started

    refused = [o for o in outcomes if o is not None]
    served = len(outcomes) - len(refused)
    assert refused, "a burst of 3N calls must meet the limit"
    # The window slides: however slow the burst, no second serves more than `limit`.
    assert limit <= served <= limit * (math.floor(elapsed) + 1)
    for error in refused:
        assert error.http_status == 429
        assert error.json_body["error"]["type"] == "invalid_request_error"
        assert error.json_body["error"]["code"] == "rate_limit"
        assert "Too many requests" in error.json_body["error"]["message"]
        assert error.headers["Stripe-Should-Retry"] == "true"
        assert int(error.headers["Retry-After"]) >= 1
    assert sorted(c["status"] for c in sandbox.requests()) == [200] * served + [429] * len(refused)


def test_the_next_n_calls_get_the_rate_limits_429_then_calls_are_served_again(client, sandbox):
    sandbox.faults(api_rate_limit_next_calls=2)
    for left in (1, 0):
        with pytest.raises(stripe.RateLimitError, match="api_rate_limit_next_calls") as refused:
            client.v1.checkout.sessions.list()
        assert refused.value.json_body["error"]["code"] == "rate_limit"
        assert refused.value.headers["Stripe-Should-Retry"] == "true"
        assert refused.value.headers["Retry-After"] == "1"
        assert sandbox.faults()["api_rate_limit_next_calls"] == left

    assert client.v1.checkout.sessions.list().data == []
    assert [c["status"] for c in sandbox.requests()] == [429, 429, 200]


def admitted(call) -> bool:
    """Make the call: True if the sandbox served it, False if the rate limit refused it (a
    refused call costs nothing, so asking again until one is admitted changes no window)."""
    try:
        call()
    except stripe.RateLimitError:
        return False
    return True


def _quiet_for(sandbox, seconds: float) -> bool:
    """The last /v1 call the sandbox received arrived more than `seconds` ago."""
    calls = sandbox.requests()
    return not calls or time.time() - calls[-1]["at"] > seconds


def test_the_rate_limit_window_slides_and_zero_switches_it_off(client, sandbox):
    sandbox.faults(api_rate_limit_per_second=1)
    client.v1.checkout.sessions.list()
    with pytest.raises(stripe.RateLimitError):
        client.v1.checkout.sessions.list()

    wait_until(
        lambda: admitted(client.v1.checkout.sessions.list),
        timeout=2 * traffic.RATE_WINDOW_SECONDS,
        what="the window to slide past the first call",
    )

    sandbox.faults(api_rate_limit_per_second=0)
    for _ in range(5):
        client.v1.checkout.sessions.list()


def test_the_rate_limit_leaves_the_hosted_page_and_control_routes_alone(client, sandbox):
    session = new_session(client)
    sandbox.faults(api_rate_limit_per_second=2)  # room for the session above and one more
    for _ in range(5):
        with urllib.request.urlopen(sandbox.pay_page_url(session.id), timeout=5) as page:
            assert page.status == 200
        sandbox.events()
    client.v1.checkout.sessions.retrieve(session.id)


def test_the_endpoint_limit_counts_each_method_and_path_template_on_its_own(client, sandbox):
    """Stripe's per-endpoint limit: retrieving two different sessions is one endpoint
    (`GET /v1/checkout/sessions/{id}`), listing them another, creating them a third."""
    first, second = new_session(client), new_session(client)
    # The windows count calls made before a limit is switched on: these two leave them first.
    wait_until(lambda: _quiet_for(sandbox, traffic.RATE_WINDOW_SECONDS), what="a window without the sessions' creation")
    sandbox.faults(api_endpoint_rate_limit_per_second=2)
    limited_from = time.time()
    client.v1.checkout.sessions.retrieve(first.id)
    client.v1.checkout.sessions.retrieve(second.id)
    with pytest.raises(stripe.RateLimitError) as refused:
        client.v1.checkout.sessions.retrieve(first.id)
    body = refused.value.json_body["error"]
    assert (refused.value.http_status, body["code"], body["type"]) == (429, "rate_limit", "invalid_request_error")
    assert "GET /v1/checkout/sessions/{id}" in body["message"]
    assert "api_endpoint_rate_limit_per_second" in body["message"]
    assert refused.value.headers["Stripe-Should-Retry"] == "true"
    # Other endpoints have budgets of their own in the same second.
    client.v1.checkout.sessions.list()
    client.v1.checkout.sessions.list()
    new_session(client)
    logged = [c for c in sandbox.requests() if c["at"] >= limited_from]
    assert {c["endpoint"] for c in logged} == {
        "POST /v1/checkout/sessions",
        "GET /v1/checkout/sessions/{id}",
        "GET /v1/checkout/sessions",
    }
    assert [c["status"] for c in logged if c["endpoint"] == "GET /v1/checkout/sessions/{id}"] == [200, 200, 429]

    wait_until(
        lambda: admitted(lambda: client.v1.checkout.sessions.retrieve(first.id)),
        timeout=2 * traffic.RATE_WINDOW_SECONDS,
        what="the endpoint's window to slide",
    )
    sandbox.faults(api_endpoint_rate_limit_per_second=0)
    for _ in range(4):
        client.v1.checkout.sessions.retrieve(first.id)


def test_the_account_limit_and_the_endpoint_limit_both_hold(client, sandbox):
    sandbox.faults(api_rate_limit_per_second=3, api_endpoint_rate_limit_per_second=2)
    client.v1.checkout.sessions.list()
    client.v1.checkout.sessions.list()
    with pytest.raises(stripe.RateLimitError, match="api_endpoint_rate_limit_per_second"):
        client.v1.checkout.sessions.list()
    client.v1.events.list()
    with pytest.raises(stripe.RateLimitError, match="api_rate_limit_per_second"):
        client.v1.webhook_endpoints.list()


# -- switching off, reset, validation ------------------------------------------------


def test_null_false_and_zero_switch_the_traffic_faults_off_and_reset_clears_them(sandbox):
    on = {
        "api_latency_seconds": 2,
        "api_latency_jitter_seconds": 1,
        "api_hang": True,
        "api_rate_limit_per_second": 3,
        "api_endpoint_rate_limit_per_second": 4,
        "api_rate_limit_next_calls": 5,
    }
    off = {
        "api_latency_seconds": 0.0,
        "api_latency_jitter_seconds": 0.0,
        "api_hang": False,
        "api_rate_limit_per_second": 0,
        "api_endpoint_rate_limit_per_second": 0,
        "api_rate_limit_next_calls": 0,
    }
    assert {k: sandbox.faults(**on)[k] for k in on} == {
        **on,
        "api_latency_seconds": 2.0,
        "api_latency_jitter_seconds": 1.0,
    }
    assert {k: sandbox.faults(**dict.fromkeys(on))[k] for k in on} == off
    sandbox.faults(**on)
    sandbox.reset()
    assert {k: sandbox.faults()[k] for k in on} == off


@pytest.mark.parametrize(
    "body",
    [
        {"api_latency_seconds": -0.1},
        {"api_latency_seconds": 121},
        {"api_latency_seconds": 1e308},
        {"api_latency_seconds": "1"},
        {"api_latency_jitter_seconds": True},
        {"api_hang": 1},
        {"api_rate_limit_per_second": -1},
        {"api_rate_limit_per_second": 2.5},
        {"api_rate_limit_per_second": 10**9},
        {"api_endpoint_rate_limit_per_second": -1},
        {"api_endpoint_rate_limit_per_second": "25"},
    ],
)
def test_a_traffic_fault_out_of_range_is_refused_and_changes_nothing(sandbox, body):
    with pytest.raises(SandboxControlError) as refused:
        sandbox.request("POST", "/_sandbox/faults", {**body, "api_unavailable": True})
    assert refused.value.status == 400 and next(iter(body)) in refused.value.message
    assert sandbox.faults()["api_unavailable"] is False


# -- request log ---------------------------------------------------------------------


def test_the_request_log_lists_each_v1_call_with_its_arrival_time(client, sandbox):
    before = time.time()
    session = client.v1.checkout.sessions.create(
        params={
            "mode": "payment",
            "success_url": "http://shop.test/ok",
            "line_items": [
                {"price_data": {"currency": "usd", "unit_amount": 700, "product_data": {"name": "Pen"}}, "quantity": 1}
            ],
        },
        options={"idempotency_key": "order-7-attempt-1"},
    )
    middle = time.time()
    client.v1.checkout.sessions.retrieve(session.id)
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.checkout.sessions.retrieve("cs_test_nope")
    after = time.time()
    sandbox.events()  # control routes and the hosted page are not provider calls
    urllib.request.urlopen(sandbox.pay_page_url(session.id), timeout=5).close()

    calls = sandbox.requests()
    assert [(c["method"], c["path"], c["status"]) for c in calls] == [
        ("POST", "/v1/checkout/sessions", 200),
        ("GET", f"/v1/checkout/sessions/{session.id}", 200),
        ("GET", "/v1/checkout/sessions/cs_test_nope", 404),
    ]
    assert calls[0]["idempotency_key"] == "order-7-attempt-1"
    assert before <= calls[0]["at"] <= middle <= calls[1]["at"] <= calls[2]["at"] <= after
    assert sandbox.request_count() == 3
    assert sandbox.request_count(method="GET") == 2
    assert sandbox.request_times(since=middle) == [calls[1]["at"], calls[2]["at"]]

    sandbox.reset()
    assert sandbox.requests() == [] and sandbox.request_count() == 0


def test_the_request_log_keeps_the_newest_calls_and_exact_counts():
    log = RequestLog(size=3)
    for n in range(5):
        log.record("GET", f"/v1/events/evt_{n}", None)
    assert [c["path"] for c in log.calls()] == [f"/v1/events/evt_{n}" for n in (2, 3, 4)]
    assert sum(r["count"] for r in log.counts()) == 5


def test_peak_in_window_counts_the_busiest_second():
    assert peak_in_window([]) == 0
    assert peak_in_window([0.0, 0.5, 0.99, 1.0, 1.2, 3.0]) == 4  # 0.5 .. 1.2
    assert peak_in_window([0.0, 1.0, 2.0]) == 1


def test_a_bad_since_is_refused(sandbox):
    with pytest.raises(SandboxControlError) as refused:
        sandbox.get("/_sandbox/requests", {"since": "yesterday"})
    assert refused.value.status == 400
