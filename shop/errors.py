"""Errors in words, as HTML or JSON, never a stack trace."""

from flask import got_request_exception, jsonify, make_response, render_template_string, request
from flask_wtf.csrf import CSRFError
from sqlalchemy.exc import InterfaceError, OperationalError
from werkzeug.exceptions import HTTPException, NotFound

from .extensions import db
from .web.answers import answer_after_commit, wants_json

PAGE = """{% extends "base.html" %}{% block content %}<h1>{{ title }}</h1><p>{{ message }}</p>
<p><a href="{{ url_for('storefront.catalog') }}">Back to the shop</a></p>{% endblock %}"""

MESSAGES = {
    400: "The request could not be understood.",
    401: "Please log in.",
    404: "There is no page at this address. The link may be mistyped or out of date.",
    405: "That action is not allowed here.",
    413: "That request is too large.",
    429: "Too many requests; please wait a moment and try again.",
    500: "Something went wrong on our side. Nothing was charged twice; please try again.",
    503: "The shop's database is busy or unreachable right now. Nothing was lost; please try again in a minute.",
}


ORDER_NOT_FOUND = (
    "We cannot show this order: there is none with this reference, or this browser did not "
    "place it. If it is yours, open the private link from your confirmation email, or "
    "\u201cYour orders\u201d in the browser you ordered with."
)


class OrderNotFound(NotFound):
    """An order this request may not see, or that does not exist: one answer for both, so that
    another browser cannot learn that a reference exists."""

    in_words = True
    title = "Order not found"
    description = ORDER_NOT_FOUND


# A 404 that fits the address: what was looked for, where the address says it.
NOT_FOUND_BY_PATH = (
    ("/orders/", "Order not found", ORDER_NOT_FOUND),
    ("/cart/items/", "Not in your cart", "That item is not in your cart, or not for sale."),
)


def _not_found_words(exc) -> tuple[str, str]:
    if getattr(exc, "in_words", False):
        return getattr(exc, "title", "Not found"), exc.description
    for prefix, title, message in NOT_FOUND_BY_PATH:
        if request.path.startswith(prefix):
            return title, message
    return "Page not found", MESSAGES[404]


def _render(status: int, title: str, message: str | None):
    # werkzeug types an HTTPException's description as optional; None renders as it always has.
    if wants_json():
        return jsonify({"error": message, "status": status}), status
    return render_template_string(PAGE, title=title, message=message), status


def _with_headers_of(exc, answer):
    """The answer in words, keeping the headers werkzeug's own answer to `exc` carries besides its
    Content-Type: a 405's `Allow` (the methods the route accepts, which a client needs to put its
    request right), a 401's `WWW-Authenticate`, a 429's or 503's `Retry-After`."""
    response = make_response(answer)
    for name, value in exc.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response


def init_app(app):
    @app.errorhandler(CSRFError)
    def csrf_error(exc):
        return _render(
            400,
            "Form expired",
            "Your form expired or was sent from another site. Please go back, reload the page and try again.",
        )

    @app.errorhandler(HTTPException)
    def http_error(exc):
        if exc.response is not None:  # an answer made by whoever raised it (the login throttle's 429)
            return exc.response
        if exc.code == 404:
            return _render(404, *_not_found_words(exc))
        message = exc.description if getattr(exc, "in_words", False) else MESSAGES.get(exc.code, exc.description)
        return _with_headers_of(exc, _render(exc.code or 500, exc.name, message))

    @app.errorhandler(Exception)
    def unexpected(exc):
        try:
            db.session.rollback()
        except Exception:  # the connection is gone too
            pass
        answer = answer_after_commit()
        if answer is not None:
            # The request's use case had committed: say what was done, not that it failed.
            app.logger.error("error after this request's commit, answered with what was done: %r", exc)
            try:
                return answer()
            except Exception:
                app.logger.exception("the after-commit answer failed too")
        if isinstance(exc, (OperationalError, InterfaceError)):
            # The database is unreachable (down, restarting, out of connections): not a bug in
            # this request, and saying so tells the customer to come back rather than give up.
            app.logger.error("database unavailable: %s", exc)
            return _render(503, "Back in a moment", MESSAGES[503])
        app.logger.exception("unhandled error")
        # Flask signals an unhandled error only when no handler takes it, and this one takes them
        # all: signal it here, so what listens for it (Sentry's Flask integration, with SENTRY_DSN)
        # hears of every 500, with its request.
        got_request_exception.send(app, _async_wrapper=app.ensure_sync, exception=exc)
        return _render(500, "Sorry", MESSAGES[500])


def init_teardown(app, db) -> None:
    """Registered after Flask-SQLAlchemy, so it runs before its teardown: end the request's
    session here, where a failure can be contained. Closing a session rolls back its connection;
    when that connection was killed under the request, the rollback raises after the response
    was made, outside every error handler, and the server sent its bare "Internal Server Error"
    in place of the page. The connection is invalidated by that failure (the pool replaces it),
    so nothing is lost by logging and forgetting the session."""

    @app.teardown_appcontext
    def _end_session(_exc):
        try:
            db.session.remove()
        except Exception as exc:
            app.logger.warning("could not end the request's database session cleanly (%s); dropped it", exc)
            db.session.registry.clear()
