"""The operator console: what is stuck, what died, what needs a human, and the buttons that
fix it through the same use cases the rest of the shop runs (it is not a back door)."""

from ..extensions import login_manager
from ..web.answers import keep_private, negotiates
from . import (  # noqa: F401  (each registers its routes on bp)
    acks,
    cancel_actions,
    email_actions,
    email_change,
    mail_pages,
    money_actions,
    order_actions,
    outbox_actions,
    refund_actions,
    routes,
    sessions,
    ship_actions,
    stock_pages,
    throttle,
    webhook_actions,
)
from .auth import require_operator
from .blueprint import bp

# Every console answer, the login page and the 302/401 in front of the rest included: no-store.
keep_private(bp)
# Every console URL answers HTML or JSON by Accept, and says so to caches (Vary: Accept).
negotiates(bp)


def init_app(app) -> None:
    app.register_blueprint(bp)
    throttle.init_app(app)
    sessions.init_app(app)
    # Flask-Login's LoginManager sets login_view to None in __init__ without an annotation, so a
    # type checker takes None for its type; it is the login endpoint's name.
    login_manager.login_view = "console.login"  # pyright: ignore[reportAttributeAccessIssue]
    # Ahead of CSRFProtect's own check: a caller who is not logged in learns only "log in",
    # whatever the form carried (a 302 for a browser, a 401 for JSON), never "form expired".
    app.before_request_funcs.setdefault(None, []).insert(0, require_operator)
