"""The headers a cache and a client read (docs/REFERENCE.md, Routes, Conventions): `Vary: Accept` on
every answer of a URL that answers HTML or JSON by its Accept header, `Cache-Control: no-store` on
every answer that shows one customer's or operator's own data, and `Allow` on every 405."""

from __future__ import annotations

import pytest

from payment_helpers import HTML, JSON
from support import log_in

MISSING_ORDER = "/orders/BK-ZZZZZZZZ"


def vary(response) -> set[str]:
    return {v.strip().lower() for v in response.headers.get("Vary", "").split(",") if v.strip()}


def allowed(response) -> set[str]:
    return {m.strip() for m in response.headers.get("Allow", "").split(",") if m.strip()}


@pytest.fixture
def operator(shop):
    client = shop.test_client()
    token = log_in(shop, client)
    return client, token


# -- Vary: Accept ---------------------------------------------------------------------------------


def test_every_answer_of_a_negotiated_url_varies_on_accept_pages_errors_and_redirects(browser):
    ref = browser.buy()
    client = browser.client
    answers = {}
    for accept in (HTML, JSON):
        kind = accept["Accept"]
        for url in ("/", "/cart", "/orders", f"/orders/{ref}", f"/orders/{ref}/cancel", MISSING_ORDER, "/nowhere"):
            answers[f"GET {url} as {kind}"] = client.get(url, headers=accept)
        answers[f"POST /cart/items as {kind}"] = browser.add(headers=accept)
        answers[f"POST /checkout (empty email) as {kind}"] = browser.checkout_cart(email="", headers=accept)
        answers[f"POST / (405) as {kind}"] = client.post("/", headers=accept)
        answers[f"GET /console/ logged out as {kind}"] = client.get("/console/", headers=accept)
    for what, r in answers.items():
        assert "accept" in vary(r), f"{what}: {r.status_code}, Vary {r.headers.get('Vary')!r}"
    # The two answers do differ by Accept: the reason for the header.
    assert answers["GET /console/ logged out as text/html"].status_code == 302
    assert answers["GET /console/ logged out as application/json"].status_code == 401


def test_vary_accept_is_added_to_the_cookie_vary_flask_sets_not_instead_of_it(browser):
    # The cart reads the session (the browser's id): Flask says Vary: Cookie, and Accept joins it.
    for accept in (HTML, JSON):
        r = browser.client.get("/cart", headers=accept)
        assert {"accept", "cookie"} <= vary(r), r.headers.get("Vary")
        assert len(r.headers.getlist("Vary")) == 1  # one header, merged, not two that a cache may take one of


def test_console_pages_and_their_json_vary_on_accept(shop, operator):
    client, _token = operator
    for url in ("/console/", "/console/orders", "/console/outbox", "/console/sweeps"):
        for accept in (HTML, JSON):
            r = client.get(url, headers=accept)
            assert r.status_code == 200, (url, accept, r.status_code)
            assert "accept" in vary(r), (url, accept, r.headers.get("Vary"))
    # The login page redirects an operator already in, whatever they accept; logged out, the same
    # URL answers a form or JSON by Accept. Every answer of the URL says so, this one too.
    r = client.get("/console/login", headers=JSON)
    assert r.status_code == 302 and "accept" in vary(r), r.headers.get("Vary")


def test_answers_that_never_look_at_accept_do_not_vary_on_it(shop):
    client = shop.test_client()
    for url in ("/metrics", "/healthz", "/static/shop.js"):
        for accept in (HTML, JSON):
            with client.get(url, headers=accept) as r:  # closed: a static file's answer holds it open
                assert "accept" not in vary(r), (url, r.headers.get("Vary"))


# -- Cache-Control: no-store ----------------------------------------------------------------------


def test_the_customers_own_pages_and_their_json_are_never_stored(browser):
    ref = browser.buy()
    client = browser.client
    answers = {}
    for accept in (HTML, JSON):
        kind = accept["Accept"]
        for url in ("/cart", "/orders", f"/orders/{ref}", f"/orders/{ref}/cancel", MISSING_ORDER):
            answers[f"GET {url} as {kind}"] = client.get(url, headers=accept)
        answers[f"GET /checkout/return as {kind}"] = client.get(
            f"/checkout/return?order={ref}&session_id=cs_test_x", headers=accept
        )
        answers[f"POST /cart/items as {kind}"] = browser.add(headers=accept)
        answers[f"POST /checkout refused as {kind}"] = browser.checkout_cart(email="not-an-email", headers=accept)
        answers[f"POST /orders/{ref}/pay as {kind}"] = browser.post(f"/orders/{ref}/pay", headers=accept)
    answers["POST /checkout placed"] = browser.checkout_cart()
    for what, r in answers.items():
        assert r.headers.get("Cache-Control") == "no-store", f"{what}: {r.status_code} {r.headers.get('Cache-Control')}"
    assert answers["POST /checkout placed"].status_code == 303
    assert answers[f"GET {MISSING_ORDER} as application/json"].status_code == 404


def test_the_public_catalog_keeps_caching_as_before(browser):
    for accept in (HTML, JSON):
        r = browser.client.get("/", headers=accept)
        assert r.status_code == 200 and "no-store" not in r.headers.get("Cache-Control", "")


def test_every_console_answer_is_never_stored_login_and_the_door_included(shop, operator):
    anonymous = shop.test_client()
    answers = {
        "login page": anonymous.get("/console/login", headers=HTML),
        "login JSON": anonymous.get("/console/login", headers=JSON),
        "302 to login": anonymous.get("/console/orders", headers=HTML),
        "401 JSON": anonymous.get("/console/orders", headers=JSON),
    }
    client, token = operator
    for url in ("/console/", "/console/orders?stuck=1", "/console/audit", "/console/webhooks", "/console/sweeps"):
        for accept in (HTML, JSON):
            answers[f"{url} {accept['Accept']}"] = client.get(url, headers=accept)
    with client.get("/console/orders?format=csv") as csv:  # closed: its rows stream from a generator
        answers["csv"] = csv
    answers["unknown order"] = client.get("/console/orders/BK-ZZZZZZZZ", headers=JSON)
    answers["action"] = client.post("/console/outbox/retry-dead", data={"csrf_token": token}, headers=JSON)
    answers["logout"] = client.post("/console/logout", data={"csrf_token": token}, headers=JSON)
    for what, r in answers.items():
        assert r.headers.get("Cache-Control") == "no-store", f"{what}: {r.status_code} {r.headers.get('Cache-Control')}"
    assert answers["302 to login"].status_code == 302 and answers["401 JSON"].status_code == 401
    assert answers["csv"].status_code == 200 and answers["unknown order"].status_code == 404


# -- Allow on 405 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("accept", [HTML, JSON], ids=["html", "json"])
def test_a_405_names_the_methods_the_route_accepts(shop, operator, accept):
    client, _token = operator
    cases = [
        ("POST", "/", {"GET", "HEAD", "OPTIONS"}),  # the catalog
        ("POST", "/orders", {"GET", "HEAD", "OPTIONS"}),
        ("GET", "/cart/items", {"POST", "OPTIONS"}),
        ("GET", "/console/orders/BK-ZZZZZZZZ/reconcile", {"POST", "OPTIONS"}),  # a POST-only console action
        ("GET", "/console/outbox/retry-dead", {"POST", "OPTIONS"}),
        ("DELETE", "/console/login", {"GET", "HEAD", "POST", "OPTIONS"}),
        ("PUT", "/metrics", {"GET", "HEAD", "OPTIONS"}),
    ]
    for method, url, methods in cases:
        r = client.open(url, method=method, headers=accept)
        assert r.status_code == 405, (method, url, r.status_code)
        assert allowed(r) == methods, (method, url, r.headers.get("Allow"))
        if accept is JSON:
            assert r.get_json()["status"] == 405
        else:
            assert "not allowed" in r.get_data(as_text=True)
