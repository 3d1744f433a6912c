"""The web layer's shared parts: what every request meets before a view (shop/web/requests.py),
how views answer (answers.py), how an order is shown (serialize.py) and the customer's words for
codes and states (words.py). `init_app` wires the first into the app."""

from __future__ import annotations

from ..emails import refund_failure_words
from ..money import format_money
from ..provider.gateway import hosted_page_origins
from ..public_urls import public_url_for
from . import proxies, request_ids
from .answers import negotiated
from .cookies import DailyRefreshSessionInterface
from .requests import (
    IdConverter,
    LimitChunkedBodies,
    WorkConverter,
    refuse_nul_text,
    relative_routing_redirects,
)
from .words import status_words


def security_headers(config) -> dict[str, str]:
    """The headers every answer carries (docs/REFERENCE.md, Routes, Conventions). No inline script
    or style anywhere: the pages' only script is static/shop.js and their only style shop.css,
    so an injected `<script>` or `onclick=` does not run. Forms may post here and be redirected
    to the provider's hosted payment page (checkout, "Pay now"); nothing may frame a page (the
    console's buttons cannot be clicked through an invisible frame)."""
    form_targets = " ".join(["'self'", *hosted_page_origins(config)])
    headers = {
        "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
        "img-src 'self' data:; object-src 'none'; frame-ancestors 'none'; "
        f"base-uri 'none'; form-action {form_targets}",
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        # An order page's URL may carry its access token: it must not leave in a Referer.
        "Referrer-Policy": "same-origin",
    }
    if config["PUBLIC_BASE_URL"].startswith("https://"):
        # Only when the shop is served over https: over http the header would be ignored anyway,
        # and pinning https on a host that cannot serve it locks browsers out for a year.
        headers["Strict-Transport-Security"] = "max-age=31536000"
    return headers


def short_id(value: str | None) -> str:
    """A provider id as an operator's page shows it beside the order's reference: its start,
    enough to tell it apart and find it at the provider, not enough to open the customer's
    order with (a session id does, on the payment return page)."""
    if not value or len(value) <= 16:
        return value or ""
    return value[:14] + "\u2026"


def ask_once_if_async(app) -> None:
    """Flask asks of each hook and view it calls, on every request, whether it is a coroutine
    function (`ensure_sync`, meant to be overridden): about 30 times a request here. A plain
    function's answer never changes, so it is kept (for the functions of the app's lifetime, at
    most 4,096); anything else is asked as before."""
    ensure_sync = app.ensure_sync
    plain: dict = {}

    def ensure_sync_once(func):
        try:
            if func in plain:
                return func
        except TypeError:  # unhashable: asked every time
            return ensure_sync(func)
        made = ensure_sync(func)
        if made is func and len(plain) < 4096:
            plain[func] = True
        return made

    app.ensure_sync = ensure_sync_once


def init_app(app) -> None:
    """What every request meets before a view: the URL converters, routing redirects made
    relative (never built from the request's Host), the refusal of NUL bytes in text, the cap on
    chunked bodies (the webhook reads its own, capped, raw body) and the template filters and
    `public_url_for`; and what every answer leaves with: the security headers, and `Vary: Accept`
    when the answer was chosen by the Accept header; and every request's id (`X-Request-ID`, kept
    or made, in the log context and echoed: request_ids.py); the session cookie, sent again only
    when it changed or is a day old (cookies.py). The client's address
    (`request.remote_addr`) is the one the trusted proxies name (proxies.py)."""
    app.url_map.converters.update(id=IdConverter, work=WorkConverter)
    app.session_interface = DailyRefreshSessionInterface()
    ask_once_if_async(app)
    request_ids.init_app(app)
    app.jinja_env.filters["status_words"] = status_words
    app.jinja_env.filters["refund_failure"] = refund_failure_words
    app.jinja_env.filters["money"] = format_money
    app.jinja_env.filters["short_id"] = short_id
    # A page that shows an absolute address of the shop (the order's private link) takes it from
    # PUBLIC_BASE_URL, never from the request's Host (url_for's _external).
    app.jinja_env.globals["public_url_for"] = public_url_for
    app.before_request(relative_routing_redirects)
    app.before_request(refuse_nul_text)
    headers = security_headers(app.config)

    @app.after_request
    def _send_security_headers(response):
        # after_request also runs for error handlers' answers (404, 429, 500 in words).
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        return response

    @app.after_request
    def _vary_on_accept(response):
        # A URL that answers HTML or JSON by Accept says so on every answer, errors and redirects
        # included (docs/REFERENCE.md, Routes, Conventions). `vary.add` keeps what is there; Flask
        # adds `Cookie` after this when the session was read.
        if negotiated():
            response.vary.add("Accept")
        return response

    app.wsgi_app = LimitChunkedBodies(
        app.wsgi_app, app.config["MAX_CONTENT_LENGTH"], skip_paths=("/webhooks/stripe",), headers=headers
    )
    # Outermost: the client's address is settled before anything else reads the request.
    proxies.install(app)
