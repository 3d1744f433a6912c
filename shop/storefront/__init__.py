"""The storefront: catalog, cart, checkout, order pages, payment return."""

from flask import Blueprint

from ..provider.guard import Priority, request_priority
from ..web.answers import keep_private, negotiates

bp = Blueprint("storefront", __name__)
# A customer waits on these requests' provider calls: a customer's priority (provider.guard).
request_priority(bp, Priority.CUSTOMER)
# The cart, checkout, orders and the return page are this browser's own: never stored by a cache.
# The catalog is the same for everyone and keeps caching as before.
keep_private(bp, public=("storefront.catalog",))
# Every page answers HTML or JSON by Accept, and says so to caches (Vary: Accept).
negotiates(bp)

from . import cart, routes, throttle  # noqa: E402,F401


def init_app(app) -> None:
    app.register_blueprint(bp)
    # After the blueprint: the throttle wraps the return page's registered view.
    throttle.init_app(app)
