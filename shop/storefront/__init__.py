"""The storefront: catalog, cart, checkout, order pages, payment return."""

from . import cart, order_links, routes, throttle  # noqa: F401  (cart, order_links and routes register on bp)
from .blueprint import bp


def init_app(app) -> None:
    app.register_blueprint(bp)
    # After the blueprint: the throttle wraps the return page's registered view.
    throttle.init_app(app)
    order_links.init_app(app)
