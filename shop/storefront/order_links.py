"""Where a checkout refused by UNPAID_ORDERS_PER_CLIENT leads (docs/REFERENCE.md, Storefront):
this browser's own orders, or, when the address's orders filled the limit, an email of their
links to that address (POST /orders/links, orders.links).

The answer to POST /orders/links is the same whether or not the address has such orders, and
names none of them: whoever asks learns nothing about the address. Each address may be sent the
links ORDER_LINKS_PER_ADDRESS times an hour (counted in Redis with Flask-Limiter, in this
process's memory while Redis is down), so the form cannot be used to flood someone's mailbox.
"""

from __future__ import annotations

from flask import Response, current_app, flash, jsonify, redirect, render_template_string, request, url_for
from flask_limiter import RequestLimit

from ..errors import PAGE
from ..orders.checkout import CheckoutRefused, HeldBy, normalized_email
from ..orders.links import email_order_links as schedule_links
from ..web.answers import wants_json
from ..web.limiting import refused, view_limiter, wait_in_words
from .blueprint import bp
from .forms import OrderLinksForm, first_error

ORDER_LINKS_PER_ADDRESS = 3  # an hour
LINKS_ENDPOINT = "storefront.email_order_links"
SENT = (
    "If {email} has orders waiting for payment, we have emailed their links to it. "
    "Open one to pay for it or cancel it, then check out again."
)


def unpaid_limit(refused: CheckoutRefused, email: str) -> dict | None:
    """For a checkout refused by UNPAID_ORDERS_PER_CLIENT: whose orders filled it, and where the
    customer goes from here: this browser's own orders page, or (the address's orders, which this
    browser is not shown) the form that emails their links to the address. None for other refusals."""
    if refused.held_by is None:
        return None
    if refused.held_by is HeldBy.CLIENT_ADDRESS:
        return {"held_by": refused.held_by, "limit": refused.limit}
    if refused.held_by is HeldBy.BROWSER:
        return {"held_by": refused.held_by, "limit": refused.limit, "orders_url": url_for("storefront.orders")}
    return {"held_by": refused.held_by, "limit": refused.limit, "email": email, "links_url": url_for(LINKS_ENDPOINT)}


def _answer(status: int, message: str) -> Response:
    if wants_json():
        response = jsonify({"message": message} if status < 400 else {"error": message, "status": status})
    else:
        response = current_app.make_response(render_template_string(PAGE, title="Your orders' links", message=message))
    response.status_code = status
    return response


@bp.post("/orders/links")
def email_order_links():
    """Email the links of the address's orders waiting for payment to that address (see the module)."""
    form = OrderLinksForm()
    if not form.validate():
        return _answer(400, first_error(form))
    email = (form.email.data or "").strip()
    schedule_links(email)
    message = SENT.format(email=email)
    if wants_json():
        return _answer(202, message)
    flash(message)
    return redirect(url_for("storefront.cart"), 303)


def _address() -> str:
    return "links:" + normalized_email(request.form.get("email") or "")


def _refusal(limit: RequestLimit) -> Response:
    return refused(
        limit,
        lambda wait: _answer(429, f"Too many requests for this address's links; try again in {wait_in_words(wait)}."),
    )


def init_app(app) -> None:
    """The form's own limiter, per address, wrapped around its view."""
    limiter, view = view_limiter(app, LINKS_ENDPOINT, _address, "order-links")
    per_address = limiter.limit(
        f"{ORDER_LINKS_PER_ADDRESS} per hour", key_func=_address, methods=["POST"], on_breach=_refusal
    )
    app.view_functions[LINKS_ENDPOINT] = per_address(view)
