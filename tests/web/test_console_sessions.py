"""Operator sessions (docs/REFERENCE.md, Console: login limits, the device cookie, what ends a
session): the per-account limit counts the normalized email whatever the body's shape, the
operator's own browser is not locked out by strangers' guesses, and a logout, "log out everywhere"
or a new password ends every copy of every session of the operator."""

from __future__ import annotations

import json
import re

from click.testing import Result
from sqlalchemy import func, select
from werkzeug.datastructures import MultiDict

from factories import placed_order_in
from shop.console.auth import SESSION_ENDED
from shop.console.sessions import DEVICE_COOKIE
from shop.extensions import db
from shop.models import OperatorAction
from support import OPERATOR_EMAIL as EMAIL
from support import OPERATOR_PASSWORD as PASSWORD
from support import add_operator, csrf_token, log_in, log_in_again

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}


def login(client, password=PASSWORD, email=EMAIL, headers=JSON):
    token = csrf_token(client, "/console/login")
    return client.post(
        "/console/login", data={"csrf_token": token, "email": email, "password": password}, headers=headers
    )


def login_json(client, body):
    token = csrf_token(client, "/console/login")
    return client.post("/console/login", json=body, headers={**JSON, "X-CSRFToken": token})


def copy_of_session(app, client):
    """Another browser holding a copy of `client`'s session cookie (as stolen or left behind)."""
    other = app.test_client()
    other.set_cookie("session", client.get_cookie("session").value)
    return other


def audit_rows(app, action: str) -> list[OperatorAction]:
    with app.app_context():
        rows = db.session.execute(select(OperatorAction).where(OperatorAction.action == action)).scalars().all()
        db.session.expunge_all()
        return rows


# -- 1. the account limit counts the normalized email, whatever the body's shape -------------


def test_an_email_sent_as_a_list_is_a_400_in_words_and_never_opens_a_locked_account(make_fresh_app):
    app = make_fresh_app(LOGIN_MAX_FAILURES_PER_ACCOUNT=3)
    add_operator(app)
    attacker = app.test_client()
    # Spellings of one account are one account: each spends the same budget.
    for spelling in (EMAIL, f"  {EMAIL.upper()} ", EMAIL.title()):
        assert login(attacker, "wrong", email=spelling).status_code == 401
    assert login(attacker).status_code == 429
    for body in (
        {"email": [EMAIL], "password": PASSWORD},
        {"email": [EMAIL, "x@example.com"], "password": PASSWORD},
        {"email": [f" {EMAIL.upper()}"], "password": PASSWORD},
        {"email": EMAIL, "password": [PASSWORD]},
        {"email": 5, "password": PASSWORD},
        {"email": EMAIL, "password": 12345678},
    ):
        r = login_json(attacker, body)
        assert r.status_code == 400, (body, r.status_code, r.get_data(as_text=True)[:300])
        assert "must be sent once, as text" in r.get_json()["error"], body
    assert attacker.get("/console/", headers=JSON).status_code == 401
    # The HTML form: the same field twice is refused in words too.
    token = csrf_token(attacker, "/console/login")
    page = attacker.post(
        "/console/login",
        data=MultiDict([("csrf_token", token), ("email", EMAIL), ("email", EMAIL), ("password", PASSWORD)]),
        headers=HTML,
    )
    assert page.status_code == 400 and "must be sent once, as text" in page.get_data(as_text=True)


def test_a_malformed_login_counts_against_no_budget(make_fresh_app):
    app = make_fresh_app(LOGIN_MAX_FAILURES_PER_ACCOUNT=2, LOGIN_MAX_FAILURES_PER_ADDRESS=2)
    add_operator(app)
    client = app.test_client()
    for _ in range(4):
        assert login_json(client, {"email": [EMAIL], "password": "wrong"}).status_code == 400
    assert login(client, "wrong").status_code == 401  # the first failure of two allowed
    assert login(client).status_code == 200


# -- 2. the operator's own browser is not locked out by strangers ----------------------------


def test_strangers_failures_lock_strangers_out_and_never_the_operators_own_browser(make_fresh_app):
    app = make_fresh_app(LOGIN_MAX_FAILURES_PER_ACCOUNT=5)
    add_operator(app)
    operator = app.test_client()
    assert login(operator).status_code == 200
    cookie = operator.get_cookie(DEVICE_COOKIE, path="/console")
    assert cookie is not None and cookie.http_only and cookie.same_site == "Lax" and not cookie.secure
    assert cookie.expires is not None  # long-lived: outlives the browser session
    token = operator.get("/console/audit", headers=JSON) and csrf_token(operator, "/console/audit")
    assert operator.post("/console/logout", data={"csrf_token": token}).status_code == 303

    attacker = app.test_client()
    assert [login(attacker, "wrong").status_code for _ in range(5)] == [401] * 5
    assert login(attacker, "wrong").status_code == 429
    assert login(attacker).status_code == 429  # the right password too: the account is shut to strangers
    forged = app.test_client()
    forged.set_cookie(DEVICE_COOKIE, cookie.value[:-2] + "xx", path="/console")
    assert login(forged).status_code == 429  # a cookie not signed by the shop is no device

    assert login(operator).status_code == 200  # its own budget: untouched by the attacker's failures
    assert operator.get("/console/", headers=JSON).status_code == 200


def test_the_device_cookie_has_a_budget_of_its_own_and_is_bound_to_its_operator(make_fresh_app):
    app = make_fresh_app(LOGIN_MAX_FAILURES_PER_ACCOUNT=2)
    add_operator(app)
    operator = app.test_client()
    answer = login(operator)
    assert answer.status_code == 200
    logout = operator.post("/console/logout", headers={**JSON, "X-CSRFToken": answer.get_json()["csrf_token"]})
    assert logout.status_code == 200
    assert [login(operator, "wrong").status_code for _ in range(2)] == [401, 401]
    refused = login(operator)
    assert refused.status_code == 429
    assert refused.get_json()["error"].startswith("Too many failed logins from this browser; try again in ")
    # Those failures were the device's: the account's budget is whole for everyone else.
    other = app.test_client()
    assert login(other).status_code == 200
    # The cookie names its operator: presented for another account it is no device of that account.
    with app.app_context():
        from shop.seed import upsert_operator

        upsert_operator("day-shift@example.com", "another good password")
    assert [login(operator, "wrong", email="day-shift@example.com").status_code for _ in range(2)] == [401, 401]
    assert login(app.test_client(), "another good password", email="day-shift@example.com").status_code == 429


def test_the_device_cookie_is_secure_over_https(make_fresh_app):
    app = make_fresh_app()
    add_operator(app)
    client = app.test_client()
    token = csrf_token(client, "/console/login")
    r = client.post(
        "/console/login",
        data={"csrf_token": token, "email": EMAIL, "password": PASSWORD},
        headers={**JSON, "Referer": "https://localhost/console/login"},
        base_url="https://localhost",
    )
    assert r.status_code == 200, r.get_data(as_text=True)[:300]
    cookie = next(c for c in r.headers.getlist("Set-Cookie") if c.startswith(DEVICE_COOKIE + "="))
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie


# -- 3. what ends a session -------------------------------------------------------------------


def test_a_copied_session_stops_working_after_logout(fresh_app, fresh_client, token):
    _, ref = placed_order_in(fresh_app)
    copy = copy_of_session(fresh_app, fresh_client)
    browser_copy = copy_of_session(fresh_app, fresh_client)
    assert copy.get("/console/", headers=JSON).status_code == 200
    assert fresh_client.post("/console/logout", data={"csrf_token": token}).status_code == 303

    r = copy.get("/console/", headers=JSON)
    assert r.status_code == 401 and r.get_json()["error"] == SESSION_ENDED
    before = len(audit_rows(fresh_app, "reconcile"))
    r = copy.post(f"/console/orders/{ref}/reconcile", data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 401
    assert len(audit_rows(fresh_app, "reconcile")) == before  # nothing ran
    page = browser_copy.get("/console/orders", headers=HTML)
    assert page.status_code == 302 and page.headers["Location"].startswith("/console/login")
    told = browser_copy.get(page.headers["Location"]).get_data(as_text=True)
    assert SESSION_ENDED.split("(")[0] in told and "log in again" in told


def test_logout_everywhere_from_another_browser_ends_every_session_and_is_audited(fresh_app, fresh_client, token):
    copy = copy_of_session(fresh_app, fresh_client)
    laptop = fresh_app.test_client()
    laptop_token = log_in_again(laptop)
    # Behind CSRF: without the token nothing ends.
    assert laptop.post("/console/logout-everywhere", headers=JSON).status_code == 400
    assert copy.get("/console/", headers=JSON).status_code == 200

    r = laptop.post("/console/logout-everywhere", data={"csrf_token": laptop_token}, headers=JSON)
    assert r.status_code == 200 and r.get_json()["logged_in"] is False
    for browser in (fresh_client, copy, laptop):
        assert browser.get("/console/", headers=JSON).status_code == 401
    [row] = [row for row in audit_rows(fresh_app, "logout_everywhere") if row.status == 200]
    assert row.operator == EMAIL and row.status == 200 and "ended" in row.outcome

    # A new login works again, and is not ended by the old generation.
    assert log_in_again(fresh_client)
    assert fresh_client.get("/console/", headers=JSON).status_code == 200
    assert copy.get("/console/", headers=JSON).status_code == 401


def test_a_password_reset_by_the_cli_ends_every_session(fresh_app, fresh_client, token):
    copy = copy_of_session(fresh_app, fresh_client)
    result: Result = fresh_app.test_cli_runner().invoke(
        args=["shop", "create-operator", EMAIL, "--password", "a brand new password"]
    )
    assert result.exit_code == 0 and "password reset" in result.output
    for browser in (fresh_client, copy):
        assert browser.get("/console/", headers=JSON).status_code == 401
    assert login(fresh_app.test_client()).status_code == 401  # the old password is gone
    assert login(fresh_app.test_client(), "a brand new password").status_code == 200


def test_the_login_drops_the_csrf_secret_of_the_anonymous_session(fresh_app, fresh_client):
    add_operator(fresh_app)
    before = csrf_token(fresh_client, "/console/login")
    r = fresh_client.post("/console/login", data={"csrf_token": before, "email": EMAIL, "password": PASSWORD})
    assert r.status_code == 303
    refused = fresh_client.post("/console/logout", data={"csrf_token": before}, headers=JSON)
    assert refused.status_code == 400 and re.search(r"(?i)csrf|expired|form", json.dumps(refused.get_json()))
    assert fresh_client.get("/console/", headers=JSON).status_code == 200  # still logged in
    after = csrf_token(fresh_client, "/console/audit")
    assert after != before
    assert fresh_client.post("/console/logout", data={"csrf_token": after}, headers=JSON).status_code == 200


def test_the_json_login_answers_with_the_new_sessions_token(fresh_app, fresh_client):
    add_operator(fresh_app)
    before = csrf_token(fresh_client, "/console/login")
    r = fresh_client.post(
        "/console/login", json={"email": EMAIL, "password": PASSWORD}, headers={**JSON, "X-CSRFToken": before}
    )
    assert r.status_code == 200
    after = r.get_json()["csrf_token"]
    assert fresh_client.post("/console/logout", headers={**JSON, "X-CSRFToken": before}).status_code == 400
    assert fresh_client.post("/console/logout", headers={**JSON, "X-CSRFToken": after}).status_code == 200


def test_every_session_counts_the_operators_sessions_in_the_database(fresh_app, fresh_client, token):
    from shop.models import Operator

    with fresh_app.app_context():
        generation = db.session.execute(select(func.max(Operator.session_generation))).scalar_one()
    assert fresh_client.post("/console/logout", data={"csrf_token": token}).status_code == 303
    with fresh_app.app_context():
        assert db.session.execute(select(func.max(Operator.session_generation))).scalar_one() == generation + 1


def test_log_in_helper_still_gives_a_working_token(fresh_app, make_fresh_app):
    # log_in (tests/support.py) returns the token of the logged-in session, as the console tests use it.
    client = fresh_app.test_client()
    token = log_in(fresh_app, client)
    assert client.post("/console/logout", data={"csrf_token": token}, headers=JSON).status_code == 200
