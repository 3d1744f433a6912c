"""Every request's id (docs/REFERENCE.md, Logs): an incoming `X-Request-ID` is kept (so a front
or a balancer that names requests links its lines to ours), otherwise one is made; it is in the
log context for the whole request (every line it logs, and every delivery and command its commit
writes: shop.logs, outbox.writer), and echoed on the answer."""

from __future__ import annotations

import re
import uuid

from flask import g, request

from .. import logs

HEADER = "X-Request-ID"
# What is kept of an incoming id: letters, digits and `-._:/+=@`, as long as the outbox's
# `request_id` column holds. The client chose it and it is written into every log line and shown
# in the console, so nothing that could end a line or a quoted field, open markup or escape
# (control characters, quotes, `\\`, `<>`, `%`, spaces) is kept. Anything else is replaced, not
# trimmed: half an id links nothing.
_KEPT = re.compile(r"[A-Za-z0-9._:/+=@-]{1,64}")


def request_id_of(incoming: str | None) -> str:
    if incoming and _KEPT.fullmatch(incoming):
        return incoming
    return uuid.uuid4().hex


def init_app(app) -> None:
    def begin() -> None:
        g.request_id = request_id_of(request.headers.get(HEADER))
        g.log_scope = logs.enter(request_id=g.request_id)

    def echo(response):
        request_id = g.get("request_id")
        if request_id:
            response.headers[HEADER] = request_id
        return response

    def end(_exc=None) -> None:
        scope = g.pop("log_scope", None)
        if scope is not None:
            try:
                logs.leave(scope)
            except ValueError:  # torn down in another context than it began (never in a server)
                pass

    # First of every before-request hook, so their lines carry the id too.
    app.before_request_funcs.setdefault(None, []).insert(0, begin)
    app.after_request(echo)
    app.teardown_request(end)
