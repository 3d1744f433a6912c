"""The storefront: catalog, cart, checkout, order pages, payment return."""

from flask import Blueprint

bp = Blueprint("storefront", __name__)

from . import cart, routes  # noqa: E402,F401
