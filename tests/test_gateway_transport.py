"""The gateway's HTTP transport reads proxy settings from the environment once, when its client
is built, instead of on every provider call; they still apply (shop.payments.gateway._http_client)."""
from __future__ import annotations

import pytest

from shop.payments import gateway

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
