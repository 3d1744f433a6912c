"""How a console action answers, and the small readings every console view shares: the page
number asked for, the operator acting, the order a typed reference names."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from flask import flash, jsonify, redirect, render_template, request, url_for
from flask_login import current_user

from ..extensions import db
from ..models import Order
from ..orders.lookup import order_by_reference
from ..web.answers import wants_json
from . import audit
from .auth import safe_next


def page_number() -> int:
    raw = request.args.get("page", "1")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6):
        return 1
    return max(1, min(int(raw), 100_000))


def problem(status: int, message: str, *, title: str = "Cannot do that", back: str | None = None, **extra):
    """An error in words: JSON `{"error", "status", ...}` or a console page with a way back."""
    db.session.rollback()
    audit.outcome(message)
    if wants_json():
        return jsonify({"error": message, "status": status, **extra}), status
    back = safe_next(request.form.get("next") or back, url_for("console.dashboard"))
    return render_template("console/problem.html", data={"error": message}, title=title, back=back), status


def reason_needed(form, missing: str, back: str, **extra):
    """The 400 of an action posted without the reason it needs: the form's own words for what is
    wrong with its reason field, else `missing` (what to say)."""
    message = form.reason.errors[0] if form.reason.errors else missing
    return problem(400, message, title="A reason is needed", back=back, **extra)


def done(message: str, payload: dict, default_url: str, category: str = "ok", keep=None):
    """An action went through: JSON with what changed, or back to the page the button was on.
    `keep`: the outbox row acted on, which the list back there keeps showing with its new state
    although it no longer matches the list's filter (a retried dead letter is not dead)."""
    audit.outcome(message)
    if wants_json():
        return jsonify({**payload, "message": message}), 200
    flash(message, category)
    target = safe_next(request.form.get("next"), default_url)
    if keep is not None:
        target = _keeping(target, keep)
    return redirect(target, 303)


def _keeping(url: str, ref) -> str:
    parts = urlsplit(url)
    if parts.path != url_for("console.outbox"):
        return url
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "keep"] + [("keep", str(ref))]
    return urlunsplit(parts._replace(query=urlencode(query)))


def operator_name() -> str:
    return getattr(current_user, "email", "?")


def find_order(reference: str) -> Order | None:
    return order_by_reference(reference.strip().upper())


def audited_order(reference: str, what: str, reason: str | None = None) -> Order | None:
    """The order an action's URL names (None: there is none), told to the audit trail as what the
    action is about (`what` and the reference) with the operator's `reason`."""
    order = find_order(reference)
    audit.about(f"{what} {order.reference if order else reference}", order_id=order and order.id, reason=reason)
    return order


def order_page(order: Order) -> str:
    """The order's own console page: where an action on it goes back to."""
    return url_for("console.order_detail", reference=order.reference)


def no_order(reference: str, back: str | None = None):
    """The 404 page that says there is no order `reference`; back to the orders unless `back`."""
    return problem(
        404, f"There is no order {reference}.", title="No such order", back=back or url_for("console.orders")
    )


def of_order(view: Callable[[Order], Any]) -> Callable[[str], Any]:
    """A console page of the order its URL names (`<reference>`): `view(order)`, or the 404 page
    that says there is none."""

    @wraps(view)
    def page(reference: str):
        order = find_order(reference)
        return no_order(reference) if order is None else view(order)

    return page
