"""The return page's throttle (docs/REFERENCE.md, Storefront: GET /checkout/return): every
request to it, answered or not, counts per client address in Redis with Flask-Limiter; past
CHECKOUT_RETURN_PER_MINUTE in a minute the page answers 429 in words, with Retry-After, before
the order is read or the provider asked.

The page is the one storefront route a stranger can point at the payment provider: its link is
the provider's success URL, anonymous by design (the customer may come back on another device).
It asks the provider only about the order's own session (routes.checkout_return); this limit
bounds what one client can cost the shop's provider budget and database even so, and how many
timing samples it can take. A customer comes back once or twice per payment: the default leaves
room for an office behind one NAT. The address is `request.remote_addr`: the client as the
trusted proxies name it (web.proxies, TRUSTED_PROXIES), so clients behind one balancer are each
counted on their own.

Redis unreachable: the page still works, counted in this process's memory until Redis answers
(Flask-Limiter logs a WARNING); a customer who paid must not be shut out by an outage.
"""

from __future__ import annotations

from flask import Response, current_app, render_template_string, request
from flask_limiter import RequestLimit

from ..errors import PAGE
from ..web.limiting import json_or_page, refused, view_limiter, wait_in_words

RETURN_ENDPOINT = "storefront.checkout_return"


def _address() -> str:
    return "address:" + (request.remote_addr or "-")


def _limit() -> str:
    return f"{current_app.config['CHECKOUT_RETURN_PER_MINUTE']} per minute"


def _refusal(limit: RequestLimit) -> Response:
    return refused(limit, _refusal_of)


def _refusal_of(wait: float) -> Response:
    message = (
        "Too many requests for the payment return page from your address; "
        f"try again in {wait_in_words(wait)}. If you paid, your payment is safe and your order page will show it."
    )
    current_app.logger.warning("checkout return throttled from %s", request.remote_addr)
    return json_or_page(message, wait, lambda: render_template_string(PAGE, title="Please wait", message=message))


def init_app(app) -> None:
    """The return page's own limiter (its Redis and key prefix the app's), wrapped around its view."""
    limiter, view = view_limiter(app, RETURN_ENDPOINT, _address, "checkout-return")
    by_address = limiter.limit(_limit, key_func=_address, methods=["GET"], on_breach=_refusal)
    app.view_functions[RETURN_ENDPOINT] = by_address(view)
