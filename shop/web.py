"""Small helpers shared by the blueprints: content negotiation and the browser's identity."""
from __future__ import annotations

import secrets

from flask import jsonify, render_template, request, session
from werkzeug.routing import BaseConverter, IntegerConverter, ValidationError

# Row ids are 32-bit keys. A larger number in a URL or form names nothing: answer "not found"
# without asking the database (PostgreSQL refuses to compare an integer column with it).
MAX_ID = 2**31 - 1


class IdConverter(IntegerConverter):
    """`<id:name>`: a positive row id; anything else in that place is a 404."""

    def __init__(self, map, *args, **kwargs):
        super().__init__(map, min=1, max=MAX_ID)


COMMAND_PREFIX = "cmd-"


class WorkConverter(BaseConverter):
    """`<work:name>`: one row of the outbox as the console lists it, an event delivery (`42`) or
    a scheduled command (`cmd-42`); the two tables number their rows apart. Converts to
    ("delivery" | "command", id)."""

    regex = r"(?:cmd-)?\d{1,10}"

    def to_python(self, value: str) -> tuple[str, int]:
        kind = "command" if value.startswith(COMMAND_PREFIX) else "delivery"
        number = int(value.removeprefix(COMMAND_PREFIX))
        if not 1 <= number <= MAX_ID:
            raise ValidationError()
        return kind, number

    def to_url(self, value) -> str:
        if isinstance(value, tuple):
            kind, number = value
            return f"{COMMAND_PREFIX}{number}" if kind == "command" else str(number)
        return str(value)


def work_ref(kind: str, number: int) -> int | str:
    """How the console names a delivery (its id) or a command ("cmd-<id>") in lists and URLs."""
    return f"{COMMAND_PREFIX}{number}" if kind == "command" else number


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
