"""The provider's 429 retried within the caller's time (provider.transport.GuardedHttpClient;
docs/REFERENCE.md, Settings: STRIPE_RATE_LIMIT_PER_SECOND): the sandbox answers the next N calls
with Stripe's rate-limit 429 (`api_rate_limit_next_calls`, `Stripe-Should-Retry: true`,
`Retry-After: 1`), and what the caller gets is either its answer, the same request having been
sent again after each Retry-After with the same Idempotency-Key, or, once the 429s outlast its
time, the shop's usual "provider busy" outcome. Within the caller's time is what the transport
decided (payment_helpers.ProviderTransportLog: each retry's wait against the request's deadline),
not how long the checkout took. Real database, Redis and sandbox."""

from __future__ import annotations

import time

import pytest

from payment_helpers import ProviderTransportLog, Shopper
from shop.payments import checkout_queue
from shop.provider import gateway, probe
from shop.provider.errors import ProviderFailure
from support import SleepingClock

SESSION_CREATE = ("POST", "/v1/checkout/sessions")


def _session_creates(sandbox, since: float = 0.0) -> list[dict]:
    return [c for c in sandbox.requests(since=since) if (c["method"], c["path"]) == SESSION_CREATE]


def _waited_out_each_retry_after(calls: list[dict]) -> None:
    for refused, next_call in zip(calls, calls[1:], strict=False):
        assert refused["status"] == 429, calls
        gap = next_call["at"] - refused["at"]
        assert gap >= 0.95, f"sent again {gap:.2f} s after a 429 whose Retry-After was 1 s: {calls}"


def test_a_checkout_answered_429_twice_reaches_its_payment_page_with_one_idempotency_key(
    make_shop, sandbox, monkeypatch
):
    app = make_shop(sandbox=True)
    shopper = Shopper(app)
    sandbox.faults(api_rate_limit_next_calls=2)
    transport = ProviderTransportLog(monkeypatch)

    answer = shopper.checkout()

    assert answer.status_code == 303, answer.get_data(as_text=True)
    order = shopper.latest()
    assert order["status"] == "PaymentInitiated", order
    assert answer.headers["Location"] == order["payment"]["url"]
    calls = _session_creates(sandbox)
    assert [c["status"] for c in calls] == [429, 429, 200], calls
    keys = {c["idempotency_key"] for c in calls}
    assert len(keys) == 1 and None not in keys, f"the retries were not the same request: {keys}"
    _waited_out_each_retry_after(calls)
    # Each retry waited what the provider's Retry-After said, and only because the wait and one
    # more attempt fitted in the request's budget.
    assert [(r.wait, r.retried) for r in transport.retries] == [(1.0, True), (1.0, True)], transport.retries
    transport.assert_within_deadline()


def test_when_the_429s_outlast_the_customers_budget_the_order_waits_in_line_and_the_queue_gets_its_page(
    make_shop, sandbox, monkeypatch
):
    # 2 s: the first 429's Retry-After (1 s) and another attempt fit, the second's do not. On a
    # clock where only the waits take time: a loaded run spent the whole 2 s in the checkout's
    # own work before its first call, and the order went to the line without a 429.
    app = make_shop(sandbox=True, STRIPE_REQUEST_BUDGET_SECONDS=2.0, CLOCK=SleepingClock())
    shopper = Shopper(app)
    sandbox.faults(api_rate_limit_next_calls=4)
    transport = ProviderTransportLog(monkeypatch)

    answer = shopper.checkout()

    # The second 429's wait did not fit in what was left of the 2 s: not retried, not waited out.
    assert [(r.wait, r.retried) for r in transport.retries] == [(1.0, True), (1.0, False)], transport.retries
    transport.assert_within_deadline()
    assert answer.status_code == 303, answer.get_data(as_text=True)
    assert "/pay/" not in answer.headers["Location"], answer.headers["Location"]
    waiting = shopper.latest()
    assert waiting["status"] == "PendingPayment" and waiting["payment"]["status"] == "queued", waiting
    calls = _session_creates(sandbox)
    assert [c["status"] for c in calls] == [429, 429], calls
    _waited_out_each_retry_after(calls)

    # The payment queue's own call is patient (checkout_queue.PATIENCE_SECONDS): it waits out the
    # two 429s left and creates the session, its retries with one key (its own: the key names the
    # session's expiry, which the queue sets anew).
    with app.app_context():
        checkout_queue.serve_now()
    order = shopper.latest()
    assert order["status"] == "PaymentInitiated", order
    calls = _session_creates(sandbox)
    assert [c["status"] for c in calls] == [429, 429, 429, 429, 200], calls
    assert len({c["idempotency_key"] for c in calls[2:]}) == 1, calls


def test_a_jobs_call_retries_a_429_within_its_patience_and_then_gets_provider_busy(make_fresh_app, sandbox):
    # Background work has no request deadline: its time is its patience for the rate budget
    # (STRIPE_BACKGROUND_WAIT_SECONDS), counted from the first 429. The SDK's retries as in
    # production (the tests' config makes none, and a client that makes none retries no 429).
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url, STRIPE_BACKGROUND_WAIT_SECONDS=2.0, STRIPE_MAX_NETWORK_RETRIES=2
    )
    with app.app_context():
        sandbox.faults(api_rate_limit_next_calls=1)
        with pytest.raises(gateway.ProviderRefused):  # answered: the sandbox knows no such session
            gateway.retrieve_session("cs_test_nothing")
        assert [c["status"] for c in sandbox.requests()] == [429, 404]

        since = time.time()
        sandbox.faults(api_rate_limit_next_calls=3)
        with pytest.raises(gateway.ProviderUnavailable) as busy:
            gateway.retrieve_session("cs_test_nothing")
    assert busy.value.kind == ProviderFailure.RATE_LIMITED and busy.value.retry_after == 1.0, busy.value
    assert [c["status"] for c in sandbox.requests(since=since)] == [429, 429]


def test_the_probe_asks_once_and_takes_a_429_as_no_answer(make_fresh_app, sandbox):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    sandbox.faults(api_rate_limit_next_calls=1)
    with app.app_context():
        answered, words = probe.check()
    assert answered is False and "429" in words, words
    assert [c["status"] for c in sandbox.requests()] == [429]
