"""The console's door and the shop's headers (docs/REFERENCE.md, Console and Routes, Conventions):
login throttling per account and per address, security headers on every answer, the session
cookie's flags, the operator's idle timeout, and the confirmation step in front of the two
destructive buttons (discard a dead letter, cancel an order)."""

from __future__ import annotations

import logging
import re
import time

from sqlalchemy import select

import compensation_support
from compensation_support import cancel_in
from factories import force_order, placed_order_in
from payment_helpers import Shopper
from shop.console.auth import LAST_SEEN, POLL_HEADER
from shop.extensions import db
from shop.models import Order, OutboxDelivery
from support import OPERATOR_EMAIL as EMAIL
from support import OPERATOR_PASSWORD as PASSWORD
from support import REPO_ROOT, add_operator, csrf_token, log_in

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}
TEMPLATES = REPO_ROOT / "templates"
SECURITY_HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy")


def assert_secured(response, what: str) -> None:
    for name in SECURITY_HEADERS:
        assert response.headers.get(name), f"{what}: no {name}"
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp, what
    assert response.headers["X-Frame-Options"] == "DENY" and response.headers["X-Content-Type-Options"] == "nosniff"


def login(client, password=PASSWORD, email=EMAIL, headers=JSON, **environ):
    token = csrf_token(client, "/console/login")
    return client.post(
        "/console/login",
        data={"csrf_token": token, "email": email, "password": password},
        headers=headers,
        environ_base=environ,
    )


# -- login throttling ------------------------------------------------------------------------


def test_failed_logins_past_the_account_limit_get_429_in_words_then_the_right_password_works_after_the_window(
    make_fresh_app,
):
    app = make_fresh_app(LOGIN_MAX_FAILURES_PER_ACCOUNT=3, LOGIN_FAILURE_WINDOW_SECONDS=2)
    add_operator(app)
    client = app.test_client()
    for _ in range(3):
        assert login(client, "wrong").status_code == 401
    refused = login(client)  # the right password too: the account is shut for the window
    assert refused.status_code == 429
    body = refused.get_json()
    # The window began at the first failure; Flask-Limiter rounds its end up to the next second.
    assert re.fullmatch(r"Too many failed logins for this account; try again in [123] seconds?\.", body["error"])
    assert 1 <= int(refused.headers["Retry-After"]) <= 3
    assert_secured(refused, "429")
    page = login(client, headers=HTML)
    assert page.status_code == 429 and "Too many failed logins for this account" in page.get_data(as_text=True)
    assert client.get("/console/", headers=JSON).status_code == 401

    # A sleep: Flask-Limiter keeps the window on the real clock, which no test clock moves.
    time.sleep(int(refused.headers["Retry-After"]) + 0.3)
    assert login(client).status_code == 200
    assert client.get("/console/", headers=JSON).status_code == 200


def test_correct_logins_never_count_toward_the_limit(make_fresh_app):
    app = make_fresh_app(LOGIN_MAX_FAILURES_PER_ACCOUNT=2, LOGIN_MAX_FAILURES_PER_ADDRESS=2)
    add_operator(app)
    client = app.test_client()
    for _ in range(5):
        answer = login(client)
        assert answer.status_code == 200
        assert (
            client.post("/console/logout", headers={**JSON, "X-CSRFToken": answer.get_json()["csrf_token"]}).status_code
            == 200
        )
    assert login(client, "wrong").status_code == 401
    assert login(client).status_code == 200  # one failure of two allowed: still open


def test_the_address_limit_counts_failures_on_every_account_and_spares_other_addresses(make_fresh_app):
    app = make_fresh_app(LOGIN_MAX_FAILURES_PER_ACCOUNT=100, LOGIN_MAX_FAILURES_PER_ADDRESS=3)
    add_operator(app)
    client = app.test_client()
    for n in range(3):
        assert login(client, "wrong", email=f"guess{n}@example.com", REMOTE_ADDR="10.0.0.1").status_code == 401
    refused = login(client, REMOTE_ADDR="10.0.0.1")
    assert refused.status_code == 429
    assert refused.get_json()["error"].startswith("Too many failed logins from your address; try again in ")
    assert login(app.test_client(), REMOTE_ADDR="10.0.0.2").status_code == 200


def test_with_redis_unreachable_the_login_works_and_failures_are_counted_in_memory(make_fresh_app, caplog):
    app = make_fresh_app(REDIS_URL="redis://127.0.0.1:1/0", LOGIN_MAX_FAILURES_PER_ACCOUNT=2)
    add_operator(app)
    client = app.test_client()
    with caplog.at_level(logging.WARNING, logger="flask-limiter"):
        assert login(client).status_code == 200
    assert any("falling back to in-memory storage" in r.getMessage() for r in caplog.records)
    other = app.test_client()
    assert [login(other, "wrong").status_code for _ in range(2)] == [401, 401]
    assert login(other).status_code == 429


# -- security headers ------------------------------------------------------------------------

SAMPLE = {"work": "1", "id": "1", "default": "BK-NOSUCH00"}


def console_rules(app):
    """Every (method, url) under /console from the URL map, with a sample value in each variable part."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/console") or rule.endpoint == "console.login":
            continue
        url = re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLE.get(m.group(1) or "default", SAMPLE["default"]), rule.rule)
        found += [(method, url) for method in sorted(rule.methods - {"HEAD", "OPTIONS"})]
    return found


def test_every_console_route_sends_the_security_headers_and_refuses_anonymous_and_csrf_less_requests(fresh_app):
    routes = console_rules(fresh_app)
    assert ("GET", "/console/outbox/1/discard") in routes and ("POST", "/console/outbox/1/discard") in routes
    assert len(routes) >= 15
    anonymous = fresh_app.test_client()
    token = csrf_token(anonymous, "/console/login")
    for method, url in routes:
        data = {"csrf_token": token} if method == "POST" else None
        browser = anonymous.open(url, method=method, data=data, headers=HTML)
        assert browser.status_code == 302 and browser.headers["Location"].startswith("/console/login"), (method, url)
        script = anonymous.open(url, method=method, data=data, headers=JSON)
        assert script.status_code == 401, (method, url)
        assert_secured(browser, f"anonymous {method} {url}")
        assert_secured(script, f"anonymous JSON {method} {url}")

    operator = fresh_app.test_client()
    log_in(fresh_app, operator)
    for method, url in routes:
        if method == "POST":
            for bad in ({}, {"csrf_token": "forged"}):
                r = operator.post(url, data=bad, headers=JSON)
                assert r.status_code == 400 and "form" in r.get_json()["error"].lower(), url
                assert_secured(r, f"CSRF-less POST {url}")
        else:
            r = operator.get(url, headers=HTML)
            assert r.status_code < 500, url
            assert_secured(r, f"GET {url}")
    assert operator.get("/console/", headers=JSON).status_code == 200  # the forged logout did nothing
    assert_secured(operator.get("/console/login"), "login page")


def test_storefront_pages_errors_static_files_and_operations_send_the_headers(make_fresh_app):
    app = make_fresh_app(STRIPE_API_BASE="http://127.0.0.1:12999")
    client = app.test_client()
    for url, status in (
        ("/", 200),
        ("/cart", 200),
        ("/orders/BK-NOSUCH00", 404),
        ("/no/such/page", 404),
        ("/checkout", 405),
        ("/static/shop.js", 200),
        ("/metrics", 200),
    ):
        with client.get(url, headers=HTML) as r:  # closed: a static file's answer holds it open
            assert r.status_code == status, url
            assert_secured(r, url)
    assert_secured(client.post("/cart/items", data={}, headers=JSON), "CSRF refusal")
    assert_secured(
        client.post("/cart/items", data="a" * 2_000_001, headers={"Transfer-Encoding": "chunked"}),
        "the chunked-body 413",
    )
    csp = client.get("/").headers["Content-Security-Policy"]
    # A checkout's form is redirected to the hosted payment page: form-action must allow its origin.
    assert "form-action 'self' http://127.0.0.1:12999" in csp
    assert client.get("/").headers["Referrer-Policy"] == "same-origin"
    assert "Strict-Transport-Security" not in client.get("/").headers


def test_behind_https_pages_send_hsts_and_cookies_are_secure_httponly_and_samesite(make_fresh_app):
    plain = make_fresh_app().test_client().get("/cart")
    cookie = plain.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie

    https = (
        make_fresh_app(PUBLIC_BASE_URL="https://shop.example")
        .test_client()
        .get("/cart", base_url="https://shop.example")
    )
    assert https.headers["Strict-Transport-Security"].startswith("max-age=")
    cookie = https.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" in cookie


def test_no_template_carries_inline_script_style_or_event_handlers_the_policy_would_block():
    inline = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|\sstyle\s*=|\son[a-z]+\s*=|javascript:", re.I)
    offenders = [
        f"{path.relative_to(TEMPLATES)}: {match.group(0).strip()}"
        for path in TEMPLATES.rglob("*.html")
        # An email's HTML is read by mail clients, not served under the policy, and most of them
        # ignore stylesheets: its styles are inline on purpose (it has no script).
        if path.parent.name != "email" or "<script" in path.read_text().lower()
        for match in inline.finditer(path.read_text())
    ]
    assert not offenders, offenders


# -- the operator's idle timeout ---------------------------------------------------------------


def test_an_operator_idle_past_the_timeout_is_logged_out_and_told_why(fresh_app):
    client = fresh_app.test_client()
    log_in(fresh_app, client)
    limit = fresh_app.config["CONSOLE_IDLE_TIMEOUT_SECONDS"]
    with client.session_transaction() as session:
        session[LAST_SEEN] -= limit - 60  # idle, but not for long enough
        idle_since = session[LAST_SEEN]
    assert client.get("/console/", headers=JSON).status_code == 200
    with client.session_transaction() as session:
        assert session[LAST_SEEN] >= idle_since + limit - 60  # that request counted as activity
        session[LAST_SEEN] -= limit + 1

    r = client.get("/console/", headers=JSON)
    assert r.status_code == 401
    assert r.get_json()["error"] == (
        f"You were logged out after {limit // 60} minutes without activity in the console; log in again."
    )
    assert client.get("/console/", headers=JSON).status_code == 401  # the session is over, not just refused once

    assert login(client).status_code == 200
    with client.session_transaction() as session:
        session[LAST_SEEN] -= limit + 1
    r = client.get("/console/sweeps", headers=HTML)
    assert r.status_code == 302 and r.headers["Location"].startswith("/console/login")
    assert "without activity" in client.get(r.headers["Location"]).get_data(as_text=True)


def test_a_page_polling_its_own_json_does_not_keep_the_session_alive(fresh_app):
    client = fresh_app.test_client()
    log_in(fresh_app, client)
    with client.session_transaction() as session:
        session[LAST_SEEN] -= 600
        stamped = session[LAST_SEEN]
    assert client.get("/console/", headers={**JSON, POLL_HEADER: "1"}).status_code == 200
    with client.session_transaction() as session:
        assert session[LAST_SEEN] == stamped


# -- confirmation of destructive actions -------------------------------------------------------


def dead_letter(app) -> int:
    """A real restore_inventory delivery of a cancelled order, made dead."""
    order_id, _ = placed_order_in(app)
    delivery = cancel_in(app, order_id)
    compensation_support.dead_letter(app, delivery)
    return delivery


def test_discard_asks_on_a_page_of_its_own_whose_form_discards(fresh_app):
    client = fresh_app.test_client()
    log_in(fresh_app, client)
    delivery = dead_letter(fresh_app)
    outbox = client.get("/console/outbox?status=dead").get_data(as_text=True)
    assert f'href="/console/outbox/{delivery}/discard?next=' in outbox
    assert f'action="/console/outbox/{delivery}/discard"' not in outbox  # no one-click discard

    page = client.get(f"/console/outbox/{delivery}/discard?next=/console/outbox%3Fstatus%3Ddead")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'action="/console/outbox/{delivery}/discard"' in html and 'name="reason" required' in html
    assert "Yes, discard it for good" in html and "RuntimeError: handler crashed" in html
    assert client.get(f"/console/outbox/{delivery}/discard", headers=JSON).get_json()["status"] == "dead"
    with fresh_app.app_context():
        assert db.session.get(OutboxDelivery, delivery).status == "dead"  # asking changed nothing

    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    nxt = re.search(r'name="next" value="([^"]+)"', html).group(1)
    r = client.post(
        f"/console/outbox/{delivery}/discard", data={"csrf_token": token, "next": nxt, "reason": "restocked by hand"}
    )
    assert r.status_code == 303 and r.headers["Location"] == f"/console/outbox?status=dead&keep={delivery}"
    with fresh_app.app_context():
        assert db.session.get(OutboxDelivery, delivery).status == "discarded"
    assert client.get(f"/console/outbox/{delivery}/discard", headers=JSON).status_code == 409
    assert client.get("/console/outbox/cmd-999999/discard", headers=JSON).status_code == 404


def test_the_direct_discard_post_of_a_script_still_works(fresh_app):
    client = fresh_app.test_client()
    token = log_in(fresh_app, client)
    delivery = dead_letter(fresh_app)
    r = client.post(
        f"/console/outbox/{delivery}/discard", data={"reason": "duplicate"}, headers={**JSON, "X-CSRFToken": token}
    )
    assert r.status_code == 200 and r.get_json()["status"] == "discarded"


def test_cancel_asks_on_a_page_of_its_own_whose_form_cancels_with_the_version_seen(shop):
    customer = Shopper(shop)
    client, reference = customer.client, customer.buy()
    order_page = client.get(f"/orders/{reference}").get_data(as_text=True)
    assert f'href="/orders/{reference}/cancel?version=1"' in order_page
    assert f'action="/orders/{reference}/cancel"' not in order_page  # no one-click cancel

    page = client.get(f"/orders/{reference}/cancel?version=1")
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and "Yes, cancel the order" in html and "No, keep it" in html
    assert f'action="/orders/{reference}/cancel"' in html and 'name="version" value="1"' in html
    with shop.app_context():
        assert db.session.execute(select(Order.status).where(Order.reference == reference)).scalar() == "PendingPayment"

    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    r = client.post(f"/orders/{reference}/cancel", data={"csrf_token": token, "version": "1"})
    assert r.status_code == 303 and r.headers["Location"] == f"/orders/{reference}"
    assert client.get(f"/orders/{reference}", headers=JSON).get_json()["status"] == "Cancelled"
    # Nothing left to confirm: back to the order page.
    again = client.get(f"/orders/{reference}/cancel")
    assert again.status_code == 303 and again.headers["Location"] == f"/orders/{reference}"


def test_the_confirm_page_keeps_another_browsers_token_and_refuses_a_stranger(shop):
    reference = Shopper(shop).buy()  # the owner's browser
    with shop.app_context():
        access = db.session.execute(select(Order.access_token).where(Order.reference == reference)).scalar()
    stranger = shop.test_client()
    assert stranger.get(f"/orders/{reference}/cancel").status_code == 404
    page = stranger.get(f"/orders/{reference}/cancel", query_string={"token": access})
    assert page.status_code == 200 and f'name="token" value="{access}"' in page.get_data(as_text=True)


def test_a_stale_confirm_page_cancels_nothing(shop):
    customer = Shopper(shop)
    client, reference = customer.client, customer.buy()
    html = client.get(f"/orders/{reference}/cancel?version=1").get_data(as_text=True)
    with shop.app_context():
        force_order(reference, version=Order.version + 1)
    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    r = client.post(f"/orders/{reference}/cancel", data={"csrf_token": token, "version": "1"}, headers=JSON)
    assert r.status_code == 409 and r.get_json()["status"] == "PendingPayment"
