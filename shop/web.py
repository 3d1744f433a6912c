"""Small helpers shared by the blueprints: content negotiation and the browser's identity."""
from __future__ import annotations

import secrets

from flask import jsonify, render_template, request, session


def wants_json() -> bool:
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and request.accept_mimetypes[best] > request.accept_mimetypes["text/html"]


def respond(template: str, data: dict, status: int = 200, **context):
    """Same URL, same data: JSON when the client asks for it, HTML otherwise."""
    if wants_json():
        return jsonify(data), status
    return render_template(template, data=data, **context), status


def browser_id(create: bool = True) -> str | None:
    """An opaque id for this browser, kept in the signed session cookie. Orders and carts
    belong to it; another browser sees them only with the order's access token."""
    bid = session.get("bid")
    if bid is None and create:
        bid = secrets.token_urlsafe(18)
        session["bid"] = bid
        session.permanent = True
    return bid
