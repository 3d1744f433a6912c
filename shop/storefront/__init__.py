"""The storefront: catalog, cart, checkout, order pages, payment return."""

from flask import Blueprint

from ..payments.guard import Priority, request_priority

bp = Blueprint("storefront", __name__)
# A customer waits on these requests' provider calls: a customer's priority (payments.guard).
request_priority(bp, Priority.CUSTOMER)

from . import cart, routes  # noqa: E402,F401
