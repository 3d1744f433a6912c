"""What a request brings, read safely before any view: ids in URLs, NUL bytes and broken Unicode in
text, JSON bodies read as forms, and chunked bodies held to the size limit."""

from __future__ import annotations

import io

from flask import request
from flask_wtf import FlaskForm
from werkzeug.datastructures import ImmutableMultiDict
from werkzeug.exceptions import BadRequest
from werkzeug.routing import BaseConverter, IntegerConverter, RequestRedirect, ValidationError
from wtforms import EmailField
from wtforms.validators import Email, Length

from ..public_urls import relative_location

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


class NulInText(BadRequest):
    """A NUL character in a query or form value: no field of this shop can hold one (PostgreSQL
    refuses it in text), so the request is refused in words before any use of it."""

    in_words = True
    description = "The request contains a NUL character, which no field here accepts."


class NotUnicodeText(BadRequest):
    in_words = True
    description = "The request contains text that is not valid Unicode (a lone surrogate), which no field here accepts."


class JsonTooDeep(BadRequest):
    in_words = True
    description = "The JSON body is nested too deeply to read."


class JsonNotAForm(BadRequest):
    in_words = True
    description = (
        "A JSON body here must be one object whose fields are text or numbers (or lists of them), as a form would send."
    )


def json_formdata(body) -> ImmutableMultiDict:
    """A JSON body read as a form: each field as the text a browser would have sent for it, so every
    validator sees text (a number in a text field was `len(5)`, a null `int(None)`: a 500)."""
    if not isinstance(body, dict):
        raise JsonNotAForm()
    pairs = []
    for key, value in body.items():
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue  # an absent field, as in a form
            if isinstance(item, (bool, dict, list)):
                raise JsonNotAForm()
            pairs.append((key, item if isinstance(item, str) else str(item)))
    return ImmutableMultiDict(pairs)


class Form(FlaskForm):
    """The base of every form here. Flask-WTF reads a JSON body as the form, and hands whatever it
    parsed to the form unchecked (`[1]` or `true` was a TypeError, a 500)."""

    class Meta(FlaskForm.Meta):
        def wrap_formdata(self, form, formdata):
            # formdata not given (Flask-WTF's own sentinel, not None and not a MultiDict): the request's.
            automatic = formdata is not None and not hasattr(formdata, "getlist")
            if (
                automatic
                and request.method in ("POST", "PUT", "PATCH", "DELETE")
                and not request.files
                and not request.form
                and request.is_json
            ):
                return json_formdata(request.get_json())
            return super().wrap_formdata(form, formdata)


def email_field(label: str, first) -> EmailField:
    """An email address as checkout checks it: `first` (DataRequired with what to say, or
    Optional), then its length (the limit the input's maxlength holds, said with its number), then
    its shape."""
    return EmailField(
        label,
        validators=[
            first,
            Length(max=254, message="An email address is at most 254 characters long."),
            Email(message="That does not look like an email address.", check_deliverability=False),
        ],
    )


def relative_routing_redirects() -> None:
    """before_request: a redirect the URL map itself answers (`//orders` -> `/orders`
    by merge_slashes, `/console` -> `/console/` by strict slashes) is built by werkzeug from the
    request's Host, so a forged Host would come back in its Location. The same redirect with a
    relative Location instead (docs/REFERENCE.md, Routes, Conventions); the code (308) is kept."""
    found = request.routing_exception
    if isinstance(found, RequestRedirect):
        relative = RequestRedirect(relative_location(found.new_url, request.script_root))
        relative.code = found.code
        request.routing_exception = relative


def refuse_nul_text() -> None:
    """before_request: query values, and form or JSON bodies (forms accept either: Flask-WTF reads
    a JSON body as the form). The webhook reads its raw body itself."""
    if request.endpoint == "webhooks.stripe_webhook":
        return
    values = list(request.args.values())
    if request.method in ("POST", "PUT", "PATCH"):
        if request.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
            values += request.form.values()
        elif request.is_json:
            try:
                body = request.get_json(silent=True)
            except RecursionError:  # deeper than the parser goes: not a form anyone sends
                raise JsonTooDeep() from None
            body_strings = _strings(body)
            # JSON may spell a lone surrogate ("\ud800"), which no database driver can encode; a
            # form or a query cannot (werkzeug decodes their bytes with replacement).
            if any(not _encodable(value) for value in body_strings):
                raise NotUnicodeText()
            values += body_strings
    if any("\x00" in value for value in values):
        raise NulInText()


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _strings(value) -> list[str]:
    """Every string in a parsed JSON value, keys included (iterative: depth costs no stack)."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


class LimitChunkedBodies:
    """WSGI middleware: a body sent without a Content-Length (Transfer-Encoding: chunked) is read
    here, up to the app's limit, and handed on with its length; one over the limit is a 413.
    Without it werkzeug parses such a form only up to the limit and takes the cut-off rest as
    the whole (a 2 MB chunked form was accepted, truncated). The webhook keeps its own reading,
    which records what it rejects."""

    def __init__(self, wsgi_app, limit: int, skip_paths=(), headers=None):
        self.wsgi_app, self.limit, self.skip_paths = wsgi_app, limit, tuple(skip_paths)
        self.headers = list((headers or {}).items())  # the app's security headers: it answers without it

    def __call__(self, environ, start_response):
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not environ.get("CONTENT_LENGTH") and environ.get("PATH_INFO") not in self.skip_paths:
            stream, parts, size = environ["wsgi.input"], [], 0
            while size <= self.limit:
                part = stream.read(self.limit + 1 - size)
                if not part:
                    break
                parts.append(part)
                size += len(part)
            if size > self.limit:
                body = b"Request body over the size limit.\n"
                start_response(
                    "413 Request Entity Too Large",
                    [
                        ("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body))),
                        ("Connection", "close"),
                        *self.headers,
                    ],
                )
                return [body]
            environ["wsgi.input"] = io.BytesIO(b"".join(parts))
            environ["CONTENT_LENGTH"] = str(size)
            environ.pop("HTTP_TRANSFER_ENCODING", None)
        return self.wsgi_app(environ, start_response)


def work_ref(kind: str, number: int) -> int | str:
    """How the console names a delivery (its id) or a command ("cmd-<id>") in lists and URLs."""
    return f"{COMMAND_PREFIX}{number}" if kind == "command" else number
