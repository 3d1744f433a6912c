"""The storefront: catalog, cart, checkout, order pages, payment return."""

from flask import Blueprint

from ..payments.guard import Priority, request_priority
from ..web.answers import negotiates

bp = Blueprint("storefront", __name__)
# A customer waits on these requests' provider calls: a customer's priority (payments.guard).
request_priority(bp, Priority.CUSTOMER)
# Every page answers HTML or JSON by Accept, and says so to caches (Vary: Accept).
negotiates(bp)

from . import cart, routes  # noqa: E402,F401
