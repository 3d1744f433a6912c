"""Operator sessions: the login gate in front of everything under /console, login and logout."""
from __future__ import annotations

import logging

from flask import jsonify, redirect, request, url_for
from flask_login import current_user, login_user, logout_user
from flask_wtf.csrf import generate_csrf
from sqlalchemy import select
from werkzeug.security import check_password_hash, generate_password_hash

from ..extensions import db
from ..models import Operator
from ..web import respond, wants_json
from . import bp
from .forms import LoginForm

log = logging.getLogger("shop.console")

PUBLIC_ENDPOINTS = {"console.login"}
BAD_CREDENTIALS = "That email and password do not match an operator account."
# Compared against when the email is unknown, so a wrong email costs as long as a wrong
# password and the timing does not tell which part was wrong.
_DUMMY_HASH = generate_password_hash("not-a-real-password")


def require_operator():
    """Registered first among the app's before_request hooks (see init_app)."""
    path = request.path
    if path != "/console" and not path.startswith("/console/"):
        return None
    if request.endpoint in PUBLIC_ENDPOINTS or current_user.is_authenticated:
        return None
    if wants_json():
        return jsonify({"error": "Log in as an operator first.", "status": 401,
                        "login": url_for("console.login")}), 401
    target = None
    if request.method == "GET":
        target = request.full_path.rstrip("?")
    return redirect(url_for("console.login", next=target) if target else url_for("console.login"))


def safe_next(value: str | None, default: str) -> str:
    """Only a path inside the console: never another host (an open redirect)."""
    if value and value.startswith("/console") and "\\" not in value and not value.startswith("//") \
            and value.isprintable():  # CR/LF would be a header injection (werkzeug refuses it: a 500)
        return value
    return default


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
    email = form.email.data.strip().lower()
    operator = db.session.execute(select(Operator).where(Operator.email == email)).scalar_one_or_none()
    good = check_password_hash(operator.password_hash if operator else _DUMMY_HASH, form.password.data)
    if operator is None or not good:
        db.session.rollback()
        log.warning("console login refused for %r from %s", email[:80], request.remote_addr)
        form.password.data = ""
        return respond("console/login.html", {"error": BAD_CREDENTIALS, "csrf_token": generate_csrf()}, 401,
                       form=form)
    login_user(operator)
    log.info("operator %s logged in from %s", operator.email, request.remote_addr)
    if wants_json():
        return jsonify({"logged_in": True, "operator": operator.email, "csrf_token": generate_csrf()})
    return redirect(safe_next(form.next.data, url_for("console.dashboard")), 303)


@bp.post("/logout")
def logout():
    """End the operator session."""
    email = current_user.email
    logout_user()
    log.info("operator %s logged out", email)
    if wants_json():
        return jsonify({"logged_in": False})
    return redirect(url_for("console.login"), 303)
