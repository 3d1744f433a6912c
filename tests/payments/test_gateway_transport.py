"""The gateway's HTTP transport: proxy settings read from the environment once, when its client is
built, instead of on every provider call, and still applied; and the endpoint each request counts
against in the rate budget (shop.provider.gateway: _http_client, endpoint_of)."""

from __future__ import annotations

import pytest

from shop.provider import gateway, guard

DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, every connection is refused


def test_a_proxy_named_in_the_environment_carries_every_provider_call(fresh_paying_app, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", DEAD_PROXY)
    monkeypatch.setenv("http_proxy", DEAD_PROXY)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with fresh_paying_app.app_context():
        with pytest.raises(gateway.ProviderUnavailable):
            gateway.retrieve_session("cs_test_anything")


def test_no_proxy_for_the_providers_host_reaches_it_directly(fresh_paying_app, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", DEAD_PROXY)
    monkeypatch.setenv("http_proxy", DEAD_PROXY)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with fresh_paying_app.app_context():
        # The sandbox answered (404 for a session it never made), so the proxy was bypassed.
        with pytest.raises(gateway.ProviderRefused):
            gateway.retrieve_session("cs_test_anything")


def test_the_environment_is_read_when_the_client_is_built_not_per_call(fresh_paying_app, monkeypatch):
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    with fresh_paying_app.app_context():
        with pytest.raises(gateway.ProviderRefused):
            gateway.retrieve_session("cs_test_anything")
        monkeypatch.setenv("HTTP_PROXY", DEAD_PROXY)  # too late for this process's client
        monkeypatch.setenv("http_proxy", DEAD_PROXY)
        with pytest.raises(gateway.ProviderRefused):
            gateway.retrieve_session("cs_test_anything")


@pytest.mark.parametrize(
    "method, url, endpoint",
    [
        ("POST", "https://api.stripe.com/v1/checkout/sessions", "POST /v1/checkout/sessions"),
        ("GET", "https://api.stripe.com/v1/checkout/sessions/cs_test_a1B2c3", "GET /v1/checkout/sessions/{id}"),
        ("GET", "http://127.0.0.1:12111/v1/checkout/sessions/cs_test_nothing", "GET /v1/checkout/sessions/{id}"),
        (
            "POST",
            "https://api.stripe.com/v1/checkout/sessions/cs_live_Zz9/expire",
            "POST /v1/checkout/sessions/{id}/expire",
        ),
        ("GET", "https://api.stripe.com/v1/payment_intents/pi_3Mtw", "GET /v1/payment_intents/{id}"),
        ("GET", "https://api.stripe.com/v1/events?limit=1&types[0]=x", "GET /v1/events"),
        ("DELETE", "https://api.stripe.com/v1/webhook_endpoints/we_1Mr5", "DELETE /v1/webhook_endpoints/{id}"),
        ("GET", "https://api.stripe.com/v1/refunds/re_abc", "GET /v1/refunds/{id}"),
    ],
)
def test_a_request_counts_against_its_endpoint_as_stripe_counts_it_the_method_and_the_path_template(
    method, url, endpoint
):
    assert gateway.endpoint_of(method, url) == endpoint


def test_each_endpoint_has_a_budget_of_its_own_within_the_accounts(make_fresh_app, fake_clock):
    """What the three-process burst test no longer counts: spending one endpoint's budget leaves
    another's whole (docs/REFERENCE.md, Settings: STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND)."""
    budget = 3
    app = make_fresh_app(
        STRIPE_RATE_LIMIT_PER_SECOND=1000,
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=budget,
        STRIPE_CUSTOMER_WAIT_SECONDS=0,
        CLOCK=fake_clock,  # the windows stand still: a slow real second cannot empty one mid-test
    )
    with app.app_context(), guard.customer_call():
        provider_guard = guard.get()
        for _ in range(budget):
            provider_guard.take_token("POST /v1/checkout/sessions")
        with pytest.raises(guard.Shed, match="POST /v1/checkout/sessions"):
            provider_guard.take_token("POST /v1/checkout/sessions")
        for _ in range(budget):
            provider_guard.take_token("GET /v1/checkout/sessions/{id}")
