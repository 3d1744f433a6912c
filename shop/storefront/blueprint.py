"""The storefront's blueprint and what holds for all its requests, apart from the package so that
the modules that register on it and the package that imports them never import each other."""

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
