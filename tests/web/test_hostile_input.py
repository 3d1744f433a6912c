"""Input nobody well-meaning sends, answered in words and never with a 500: NUL characters,
non-ASCII tokens, bodies over the limit with and without a Content-Length, header injection
through a redirect target, a forged session of the wrong shape, and the database going away."""

from __future__ import annotations

import http.client
import json
import re
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from factories import seed_catalog_rows
from payment_helpers import WEBHOOK_SECRET, Shopper, post_webhook, served, stripe_event
from shop.extensions import db
from support import UNREACHABLE_PROVIDER, csrf_token, log_in

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}


def _placed(app) -> tuple:
    """A browser that placed an order (provider unreachable: it stays PendingPayment)."""
    customer = Shopper(app)
    return customer.client, customer.token, customer.buy()


pytestmark = pytest.mark.shop(STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET)


def test_a_non_ascii_access_token_is_a_404_like_any_wrong_token(shop):
    _, _, reference = _placed(shop)
    stranger = shop.test_client()
    token = csrf_token(stranger, "/")
    assert stranger.get(f"/orders/{reference}?token=%C3%BC", headers=JSON).status_code == 404
    assert (
        stranger.post(f"/orders/{reference}/pay", data={"csrf_token": token, "token": "ü"}, headers=JSON).status_code
        == 404
    )
    assert (
        stranger.post(
            f"/orders/{reference}/cancel", data={"csrf_token": token, "token": "ü", "version": 1}, headers=JSON
        ).status_code
        == 404
    )


def test_a_nul_character_in_a_form_or_query_is_refused_in_words(shop):
    client = shop.test_client()
    token = csrf_token(client, "/console/login")
    r = client.post(
        "/console/login", data={"csrf_token": token, "email": "a\x00b@example.com", "password": "x"}, headers=JSON
    )
    assert r.status_code == 400 and "NUL" in r.get_json()["error"]
    assert client.get("/?q=%00", headers=JSON).status_code == 400
    log_in(shop, client)
    r = client.post("/console/outbox/cmd-1/discard", data={"csrf_token": token, "reason": "a\x00b"}, headers=JSON)
    assert r.status_code == 400


def test_a_form_over_the_limit_is_a_413_page_on_the_console_too(shop):
    client = shop.test_client()
    body = b"email=x&password=" + b"p" * 1_100_000
    r = client.post("/console/login", data=body, headers={**HTML, "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and "too large" in r.get_data(as_text=True)


def test_a_login_redirect_target_with_a_line_break_falls_back_to_the_dashboard(shop):
    client = shop.test_client()
    log_in(shop, client)
    r = client.get("/console/login?next=/console/%0D%0AX-Evil:%201")
    assert r.status_code == 302 and r.headers["Location"].endswith("/console/")
    assert "X-Evil" not in r.headers


def test_head_on_the_login_page_answers_like_get(shop):
    assert shop.test_client().head("/console/login").status_code == 200


def test_a_signed_event_whose_type_or_id_is_not_text_is_not_a_stripe_event(shop):
    session = {
        "id": "cs_test_x",
        "object": "checkout.session",
        "status": "complete",
        "payment_status": "paid",
        "amount_total": 100,
        "currency": "usd",
    }
    for odd in ({"type": ["checkout.session.completed"]}, {"type": {"a": 1}}, {"id": {"a": 1}}):
        event = {**stripe_event("checkout.session.completed", session), **odd}
        r = post_webhook(shop.test_client(), json.dumps(event).encode())
        assert r.status_code == 400, (odd, r.get_data(as_text=True)[:200])


def test_an_amount_no_order_could_have_is_read_as_missing_not_a_database_error(shop):
    _, _, reference = _placed(shop)
    session = {
        "id": "cs_test_huge",
        "object": "checkout.session",
        "status": "complete",
        "payment_status": "paid",
        "amount_total": 10**40,
        "currency": "usd",
        "client_reference_id": reference,
    }
    r = post_webhook(shop.test_client(), stripe_event("checkout.session.completed", session, "evt_huge"))
    assert r.status_code == 200 and r.get_json()["outcome"] == "proof_refused"


def test_a_forged_session_of_the_wrong_shape_is_a_new_browser_not_a_500(shop):
    client = shop.test_client()
    for odd in (123, {"a": 1}, "x\x00y", "y" * 500):
        with client.session_transaction() as session:
            session["bid"] = odd
        assert client.get("/orders", headers=JSON).get_json() == {"orders": []}
        assert client.get("/cart", headers=JSON).status_code == 200
    with client.session_transaction() as session:
        session["_user_id"] = "99999999999"
    assert client.get("/console/", headers=JSON).status_code == 401


def test_the_storefront_with_its_database_down_says_so_with_a_503(make_fresh_app):
    app = make_fresh_app(DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:9/nothing")
    r = app.test_client().get("/", headers=JSON)
    assert r.status_code == 503 and "database" in r.get_json()["error"]
    page = app.test_client().get("/", headers=HTML)
    assert page.status_code == 503 and "try again" in page.get_data(as_text=True)


def _post_chunked(base_url: str, path: str, body: bytes, headers: dict) -> tuple[int, str | None]:
    """(status, the session cookie it set, if any)."""
    where = urlsplit(base_url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        conn.putrequest("POST", path)
        for name, value in {**headers, "Transfer-Encoding": "chunked"}.items():
            conn.putheader(name, value)
        conn.endheaders()
        try:
            for start in range(0, len(body), 65536):
                piece = body[start : start + 65536]
                conn.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = conn.getresponse()
        cookie = response.getheader("Set-Cookie")
        return response.status, cookie.split(";", 1)[0] if cookie else None
    finally:
        conn.close()


def test_a_chunked_form_is_measured_whole_413_over_the_limit_and_read_whole_under_it(make_fresh_app):
    """Without a Content-Length werkzeug would parse the form up to the limit and take that as all
    of it: a 2 MB form was accepted, cut short."""
    with served(lambda base: make_fresh_app(STRIPE_API_BASE=UNREACHABLE_PROVIDER, PUBLIC_BASE_URL=base)) as (app, base):
        variant = seed_catalog_rows(app)["NB-A5-DOT"]
        form = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        big = f"variant_id={variant}&quantity=1&pad=".encode() + b"x" * 2_000_000
        assert _post_chunked(base, "/cart/items", big, form)[0] == 413
        # Under the limit it reaches the view whole: the CSRF token at its end is read, and the
        # item goes into this browser's cart.
        where = urlsplit(base)
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        conn.request("GET", "/")
        page = conn.getresponse()
        cookie = page.getheader("Set-Cookie").split(";", 1)[0]
        token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page.read().decode()).group(1)
        conn.close()
        small = f"variant_id={variant}&quantity=2&pad=".encode() + b"x" * 200_000 + f"&csrf_token={token}".encode()
        status, cookie = _post_chunked(base, "/cart/items", small, {**form, "Cookie": cookie})
        assert status == 201
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        conn.request("GET", "/cart", headers={"Accept": "application/json", "Cookie": cookie})
        items = json.loads(conn.getresponse().read())["items"]
        conn.close()
        assert [(i["variant_id"], i["quantity"]) for i in items] == [(variant, 2)]


def test_a_json_body_is_held_to_the_same_rules_as_a_form(shop):
    """Flask-WTF reads a JSON body as the form: a NUL inside it, or nesting past the parser's
    depth, is a 400 in words like in a form, not a database error or a RecursionError."""
    client = shop.test_client()
    token = csrf_token(client, "/console/login")
    r = client.post(
        "/console/login", headers={**JSON, "X-CSRFToken": token}, json={"email": "a\x00b@example.com", "password": "x"}
    )
    assert r.status_code == 400 and "NUL" in r.get_json()["error"]
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("/console/login", "/cart/items", "/checkout"):
        r = client.post(path, data=deep, content_type="application/json", headers={**JSON, "X-CSRFToken": token})
        assert r.status_code == 400 and "nested too deeply" in r.get_json()["error"], path


def test_a_signed_event_with_a_lone_surrogate_in_its_text_still_leaves_a_receipt(shop):
    """ "\\ud800" is valid JSON but no driver can store it: the delivery must still be on record."""
    from shop.models import WebhookReceipt

    session = {
        "id": "cs_test_s",
        "object": "checkout.session",
        "status": "complete",
        "payment_status": "paid",
        "amount_total": 100,
        "currency": "usd",
    }
    odd = [
        stripe_event("\ud800.created", session, "evt_ignored"),
        stripe_event("checkout.session.completed", session, "evt_\ud800"),
    ]
    for event in odd:
        r = post_webhook(shop.test_client(), json.dumps(event).encode())
        assert r.status_code == 200, r.get_data(as_text=True)
    with shop.app_context():
        receipts = db.session.execute(select(WebhookReceipt.event_id, WebhookReceipt.event_type)).all()
        db.session.remove()
    assert sorted(receipts) == [("evt_\\ud800", "checkout.session.completed"), ("evt_ignored", "\\ud800.created")]


def test_a_json_body_that_is_not_shaped_like_a_form_is_a_400_in_words(shop):
    """Flask-WTF hands a JSON body to the form as it parsed it: a list, a `true` or a nested object
    was a TypeError in the form or a validator (a 500). Numbers still read as their text."""
    variant = shop.skus["NB-A5-DOT"]
    client = shop.test_client()
    token = csrf_token(client, "/")
    headers = {**JSON, "X-CSRFToken": token}
    for body in ([1], True, 5, "x", {"variant_id": {"a": 1}}, {"quantity": True}, {"variant_id": [[1]]}):
        r = client.post("/cart/items", json=body, headers=headers)
        assert r.status_code == 400 and "JSON body" in r.get_json()["error"], (body, r.status_code)
    r = client.post("/checkout", json={"email": 5}, headers=headers)
    assert r.status_code == 400, r.get_data(as_text=True)[:300]
    r = client.post("/console/login", json={"email": None, "password": 1.5}, headers=headers)
    assert r.status_code == 400, r.get_data(as_text=True)[:300]
    r = client.post("/cart/items", json={"variant_id": variant, "quantity": 2, "note": None}, headers=headers)
    assert r.status_code == 201 and [i["quantity"] for i in r.get_json()["items"]] == [2]


def test_a_lone_surrogate_in_a_json_form_is_refused_in_words_before_the_database(shop):
    """JSON can spell "\\ud800" and no database driver can encode it: the login's lookup was a 500."""
    client = shop.test_client()
    token = csrf_token(client, "/console/login")
    for body in ({"email": "\ud800@example.com", "password": "x"}, {"email": "a@example.com", "password": "\udfff"}):
        r = client.post(
            "/console/login",
            data=json.dumps(body),
            content_type="application/json",
            headers={**JSON, "X-CSRFToken": token},
        )
        assert r.status_code == 400 and "not valid Unicode" in r.get_json()["error"], r.get_data(as_text=True)[:300]
