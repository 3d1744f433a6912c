"""Login throttling (docs/REFERENCE.md, Console): failed logins are counted per account and per
client address in Redis with Flask-Limiter; past either limit the login answers 429 in words,
without checking the password, until the window that began with the first failure ends.

The account is the normalized email (stripped, lowercased) whatever the body's shape: a login
whose email or password is not one piece of text is refused with a 400 and counts nowhere. A
login from a browser presenting a valid device cookie of the account it names (one that logged in
as that operator before: shop/console/sessions.py) counts against that device's own budget of the
same size instead of the account's and the address's: a stranger's wrong guesses shut the account
to strangers (themselves included), never to the operator's own browser.

Only failures count (`deduct_when`): an operator who logs in correctly is never locked out by
their own successes, and a refusal (429) does not extend the window. The per-address limit is
wider because one address can be many people (an office behind one NAT, clients a proxy before the shop does not
name: `request.remote_addr` is the client as the trusted proxies name it, web.proxies).

Redis unreachable: the login still works. Flask-Limiter logs a WARNING ("Rate limit storage
unreachable - falling back to in-memory storage") and counts in this process's memory until
Redis answers again; any other storage error is logged and swallowed. Locking every operator out
of the console during an outage, when it is needed most, would be worse than a per-process count.
"""

from __future__ import annotations

from flask import Response, current_app, g, render_template, request
from flask_limiter import RequestLimit
from flask_wtf.csrf import generate_csrf

from ..web.limiting import json_or_page, refused, view_limiter
from ..web.limiting import wait_in_words as _in_words
from .forms import LoginForm
from .sessions import device_for_login, login_email

LOGIN_ENDPOINT = "console.login"


def _account() -> str:
    """The budget a login spends: its device's when it presents the named account's device
    cookie, else the account's, by the normalized email the view looks up."""
    device = device_for_login()
    if device is not None:
        return "device:" + device
    return "account:" + (login_email() or "-")


def _from_known_device() -> bool:
    return device_for_login() is not None


def _address() -> str:
    return "address:" + (request.remote_addr or "-")


def _failed(response) -> bool:
    return response.status_code == 401


def _limit(setting: str):
    return lambda: f"{current_app.config[setting]} per {current_app.config['LOGIN_FAILURE_WINDOW_SECONDS']} second"


def _refusal(whose: str):
    def on_breach(limit: RequestLimit) -> Response:
        who = "from this browser" if g.get("login_device") else whose
        return refused(limit, lambda wait: _refusal_of(who, wait))

    return on_breach


def _refusal_of(who: str, wait: float) -> Response:
    message = f"Too many failed logins {who}; try again in {_in_words(wait)}."
    current_app.logger.warning("console login throttled (%s) from %s", who, request.remote_addr)

    def page() -> str:
        form = LoginForm()
        form.password.data = ""
        return render_template("console/login.html", data={"error": message, "csrf_token": generate_csrf()}, form=form)

    return json_or_page(message, wait, page)


def init_app(app) -> None:
    """One limiter per app (its Redis and key prefix are the app's), wrapped around the login view."""
    # Every other request skips the limiter at once: only the login is throttled.
    limiter, view = view_limiter(app, LOGIN_ENDPOINT, _address, "login")
    by_address = limiter.limit(
        _limit("LOGIN_MAX_FAILURES_PER_ADDRESS"),
        key_func=_address,
        methods=["POST"],
        deduct_when=_failed,
        exempt_when=_from_known_device,  # the device's own budget stands for it
        on_breach=_refusal("from your address"),
    )
    by_account = limiter.limit(
        _limit("LOGIN_MAX_FAILURES_PER_ACCOUNT"),
        key_func=_account,
        methods=["POST"],
        deduct_when=_failed,
        on_breach=_refusal("for this account"),
    )
    app.view_functions[LOGIN_ENDPOINT] = by_address(by_account(view))
