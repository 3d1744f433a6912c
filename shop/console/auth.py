"""Operator sessions: the login gate in front of everything under /console, login and logout."""

from __future__ import annotations

import logging
import time

from flask import current_app, flash, g, jsonify, redirect, request, session, url_for
from flask_login import current_user, login_user, logout_user
from flask_wtf.csrf import generate_csrf
from sqlalchemy import select
from werkzeug.security import check_password_hash, generate_password_hash

from ..extensions import db
from ..models import Operator
from ..web.answers import respond, wants_json
from .blueprint import bp
from .forms import ActionForm, LoginForm
from .sessions import (
    GENERATION,
    CredentialNotText,
    check_credentials_shape,
    end_every_session,
    normalized_email,
    remember_device,
    start_session,
)

log = logging.getLogger("shop.console")

PUBLIC_ENDPOINTS = {"console.login"}
SESSION_ENDED = (
    'Your console session was ended (a logout, "log out everywhere" or a new password for this account); log in again.'
)
BAD_CREDENTIALS = "That email and password do not match an operator account."
# Compared against when the email is unknown, so a wrong email costs as long as a wrong
# password and the timing does not tell which part was wrong.
_DUMMY_HASH = generate_password_hash("not-a-real-password")


# The session key holding when the operator last did something, in Unix seconds.
LAST_SEEN = "operator_seen_at"
# A page that polls its own JSON (the refresh of a list or the dashboard) sends this header, so
# an open tab nobody looks at does not keep the session alive.
POLL_HEADER = "X-Backstop-Poll"


def _idle_for(now: float) -> float | None:
    """Seconds since the operator's last request, or None when the session carries no stamp."""
    seen = session.get(LAST_SEEN)
    if isinstance(seen, (int, float)) and not isinstance(seen, bool):
        return now - seen
    return None


def require_operator():
    """Registered first among the app's before_request hooks (see init_app): the login gate, and
    the idle timeout, which ends an operator session after CONSOLE_IDLE_TIMEOUT_SECONDS without a
    request under /console (docs/REFERENCE.md, Console)."""
    path = request.path
    if path != "/console" and not path.startswith("/console/"):
        return None
    message = "Log in as an operator first."
    authenticated = current_user.is_authenticated  # loads the session's operator, or finds it ended
    if g.get("session_ended") and not authenticated:
        # A copy of a session whose generation is over (shop/console/sessions.py): forget it.
        logout_user()
        session.pop(GENERATION, None)
        message = SESSION_ENDED
        if not wants_json() and request.endpoint not in PUBLIC_ENDPOINTS:
            flash(message, "error")
    elif authenticated:
        now = time.time()
        idle = _idle_for(now)
        limit = current_app.config["CONSOLE_IDLE_TIMEOUT_SECONDS"]
        # A session without a stamp predates the timeout (or was made outside the login): it
        # gets one now rather than being ended on the spot.
        if idle is None or idle <= limit:
            if not request.headers.get(POLL_HEADER):
                session[LAST_SEEN] = now
            return None
        log.info("operator %s logged out after %d s without a request", current_user.email, idle)
        logout_user()
        session.pop(LAST_SEEN, None)
        message = f"You were logged out after {_minutes(limit)} without activity in the console; log in again."
        if not wants_json():
            flash(message, "error")
    if request.endpoint in PUBLIC_ENDPOINTS:
        return None
    if wants_json():
        return jsonify({"error": message, "status": 401, "login": url_for("console.login")}), 401
    target = None
    if request.method == "GET":
        target = request.full_path.rstrip("?")
    return redirect(url_for("console.login", next=target) if target else url_for("console.login"))


def _minutes(seconds: int) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def safe_next(value: str | None, default: str) -> str:
    """Only a path inside the console: never another host (an open redirect)."""
    if (
        value
        and value.startswith("/console")
        and "\\" not in value
        and not value.startswith("//")
        and value.isprintable()
    ):  # CR/LF would be a header injection (werkzeug refuses it: a 500)
        return value
    return default


@bp.before_request
def refuse_misshapen_credentials():
    """Before the login's throttle (which wraps the view): an email or password that is not one
    piece of text is a 400 in words, never a 429 nor a login of some account it spells."""
    if request.endpoint != "console.login" or request.method != "POST":
        return None
    try:
        check_credentials_shape()
    except CredentialNotText as refused:
        form = LoginForm(formdata=None)
        return respond(
            "console/login.html", {"error": refused.description, "csrf_token": generate_csrf()}, 400, form=form
        )
    return None


@bp.route("/login", methods=["GET", "POST"])
def login():
    """The operator login form. Bad credentials get 401 without saying which part was wrong."""
    form = LoginForm()
    if request.method in ("GET", "HEAD"):
        if current_user.is_authenticated:
            return redirect(safe_next(request.args.get("next"), url_for("console.dashboard")))
        form.next.data = request.args.get("next", "")
        return respond("console/login.html", {"logged_in": False, "csrf_token": generate_csrf()}, form=form)
    if not form.validate():
        error = next(iter(e for errs in form.errors.values() for e in errs), "Check the form and try again.")
        return respond("console/login.html", {"error": error, "csrf_token": generate_csrf()}, 400, form=form)
    email = normalized_email(form.email.data)
    operator = db.session.execute(select(Operator).where(Operator.email == email)).scalar_one_or_none()
    password = form.password.data
    assert password is not None, "the form validated: DataRequired refuses a missing password"
    good = check_password_hash(operator.password_hash if operator else _DUMMY_HASH, password)
    if operator is None or not good:
        db.session.rollback()
        log.warning("console login refused for %r from %s", email[:80], request.remote_addr)
        form.password.data = ""
        return respond("console/login.html", {"error": BAD_CREDENTIALS, "csrf_token": generate_csrf()}, 401, form=form)
    start_session(operator)
    login_user(operator)
    session[LAST_SEEN] = time.time()
    log.info("operator %s logged in from %s", operator.email, request.remote_addr)
    if wants_json():
        response = jsonify({"logged_in": True, "operator": operator.email, "csrf_token": generate_csrf()})
    else:
        response = redirect(safe_next(form.next.data, url_for("console.dashboard")), 303)
    return remember_device(response, operator)


def _end_sessions() -> str:
    """End every session of the current operator (this one included); returns their email."""
    operator = current_user._get_current_object()
    assert isinstance(operator, Operator), "the console runs its views for a logged-in operator only"
    email = operator.email
    end_every_session(operator)
    logout_user()
    session.pop(GENERATION, None)
    session.pop(LAST_SEEN, None)
    return email


@bp.post("/logout")
def logout():
    """End the operator session, and with it every other session of the operator (the
    CONTRACT: a logout ends them on every browser)."""
    email = _end_sessions()
    log.info("operator %s logged out (every session)", email)
    if wants_json():
        return jsonify({"logged_in": False})
    return redirect(url_for("console.login"), 303)


@bp.post("/logout-everywhere")
def logout_everywhere():
    """End every session of the operator on every browser, this one included: audited, unlike
    a logout, since it is what an operator does when a session may be in someone else's hands."""
    ActionForm()  # CSRFProtect checked the token before the view
    email = _end_sessions()
    g.audit_operator, g.audit_target = email, f"operator {email}"
    g.audit_outcome = "Every session of this operator ended."
    log.warning("operator %s ended every one of their sessions", email)
    message = "Every session of your account is ended, on every browser; log in again."
    if wants_json():
        return jsonify({"logged_in": False, "message": message})
    flash(message, "ok")
    return redirect(url_for("console.login"), 303)
