"""What an operator session rests on (docs/REFERENCE.md, Console; docs/ARCHITECTURE.md, Console
sessions): the login's credentials read one way for the view and the throttle, the session
generation that lets a logout end every session of an operator, and the device cookie that keeps
an operator's own browser out of the lockout strangers cause.

- Credentials: a form field or a JSON member must be one piece of text. Flask-WTF flattened a JSON
  list (`{"email": ["op@example.com"]}`) into the text it held while the throttle counted the
  list's spelling as another account: every variant had a fresh budget.
- Generation: Flask's session is a signed cookie, valid wherever a copy of it goes. The operator's
  row carries a counter, the session the value it had at login; a request whose session carries
  another value is logged out. Raising the counter ends every copy of every session at once.
- Device: a browser that logged in gets a signed cookie naming the operator and a random device
  id. A login naming that operator from that browser counts its failures against the device, not
  the account's budget that anyone can spend by guessing.
"""

from __future__ import annotations

import secrets

from flask import current_app, g, request, session
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import select
from werkzeug.exceptions import BadRequest

from ..extensions import db, login_manager
from ..models import Operator
from ..web.requests import MAX_ID

# The session key holding the operator's session generation at login.
GENERATION = "operator_generation"
DEVICE_COOKIE = "backstop_console_device"
DEVICE_MAX_AGE_SECONDS = 400 * 24 * 3600  # the longest lifetime browsers keep a cookie for
_DEVICE_SALT = "backstop.console.device"


class CredentialNotText(BadRequest):
    in_words = True

    def __init__(self, field: str):
        super().__init__(f"The {field} must be sent once, as text (not a list, a number or an object).")


def _sent(name: str) -> str | None:
    """One credential as the login form reads it (a JSON body stands for the form when no form
    was sent, as in shop.web.requests.Form): None when absent, CredentialNotText when not text."""
    if not request.files and not request.form and request.is_json:
        body = request.get_json(silent=True)
        value = body.get(name) if isinstance(body, dict) else None
        if value is None:
            return None
        if not isinstance(value, str):
            raise CredentialNotText(name)
        return value
    values = request.form.getlist(name) + request.files.getlist(name)
    if not values:
        return None
    if len(values) > 1 or not isinstance(values[0], str):
        raise CredentialNotText(name)
    return values[0]


def check_credentials_shape() -> None:
    """Raise CredentialNotText unless the email and the password are each absent or one text."""
    _sent("email")
    _sent("password")


def normalized_email(value: str | None) -> str:
    return (value or "").strip().lower()


def login_email() -> str | None:
    """The normalized email a login names, or None when the body is not shaped like a login
    (the view answers that with a 400, which no budget counts)."""
    try:
        return normalized_email(_sent("email"))[:254]
    except CredentialNotText:
        return None


# -- the device cookie -----------------------------------------------------------------------


def _serializer() -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt=_DEVICE_SALT)


def _device() -> tuple[int, str] | None:
    """(operator id, device id) from a valid device cookie, or None."""
    raw = request.cookies.get(DEVICE_COOKIE)
    if not raw or len(raw) > 512:
        return None
    try:
        value = _serializer().loads(raw, max_age=DEVICE_MAX_AGE_SECONDS)
    except BadSignature:  # SignatureExpired included
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int)
        and isinstance(value[1], str)
        and 0 < value[0] <= MAX_ID
    ):
        return value[0], value[1]
    return None


def device_for_login() -> str | None:
    """The device id when this login presents a valid device cookie of the account it names,
    else None (asked by the throttle before and after the view: cached for the request)."""
    if "login_device" not in g:
        g.login_device = None
        device, email = _device(), login_email()
        if device is not None and email:
            operator_id = db.session.execute(select(Operator.id).where(Operator.email == email)).scalar_one_or_none()
            if operator_id == device[0]:
                g.login_device = device[1]
    return g.login_device


def remember_device(response, operator: Operator):
    """Give (or renew) this browser's device cookie for the operator who just logged in."""
    device = _device()
    device_id = device[1] if device is not None and device[0] == operator.id else secrets.token_urlsafe(16)
    response.set_cookie(
        DEVICE_COOKIE,
        _serializer().dumps([operator.id, device_id]),
        max_age=DEVICE_MAX_AGE_SECONDS,
        path="/console",
        httponly=True,
        samesite="Lax",
        secure=request.is_secure or bool(current_app.config.get("SESSION_COOKIE_SECURE")),
    )
    return response


# -- the session generation ------------------------------------------------------------------


def start_session(operator: Operator) -> None:
    """At login, before login_user: the CSRF secret of the anonymous session is dropped (a token
    read before the login is worth nothing after it) and the operator's generation recorded."""
    field = current_app.config.get("WTF_CSRF_FIELD_NAME", "csrf_token")
    session.pop(field, None)
    g.pop(field, None)  # generate_csrf's cache for this request
    session[GENERATION] = operator.session_generation


def end_every_session(operator: Operator) -> None:
    """Every session of the operator, in every browser, ends at its next request."""
    operator.end_sessions()
    db.session.commit()


def init_app(app) -> None:
    @login_manager.user_loader
    def load_operator(operator_id):
        """The operator of a session whose generation is still the operator's, else nobody (the
        gate then says why and sends the browser to the login)."""
        try:
            number = int(operator_id)
        except (TypeError, ValueError):
            return None
        operator = db.session.get(Operator, number) if 0 < number <= MAX_ID else None
        if operator is None:
            return None
        if session.get(GENERATION) != operator.session_generation:
            g.session_ended = True
            return None
        return operator
