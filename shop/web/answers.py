"""How a view answers: content negotiation (HTML or JSON from the same data), the browser's
identity, and the answer that stands when a request fails after its use case committed."""

from __future__ import annotations

import secrets
from typing import Literal, overload

from flask import g, jsonify, make_response, render_template, request, session

# Set on the request's environ (not `g`, which outlives a request when a test or a script keeps an
# app context pushed) once a view or an error handler has looked at Accept.
NEGOTIATED = "backstop.negotiated"


def wants_json() -> bool:
    """Whether the client prefers JSON. Asking makes the answer depend on `Accept`, so the
    response says so (`Vary: Accept`, added by web.init_app): a cache in front must not hand a
    browser the JSON it kept for a script, or the reverse."""
    request.environ[NEGOTIATED] = True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json" and request.accept_mimetypes[best] > request.accept_mimetypes["text/html"]


def respond(template: str, data: dict, status: int = 200, **context):
    """Same URL, same data: JSON when the client asks for it, HTML otherwise."""
    if wants_json():
        return jsonify(data), status
    return render_template(template, data=data, **context), status


def negotiated() -> bool:
    """True once this request's answer was chosen by its Accept header (`wants_json` was asked)."""
    return bool(request.environ.get(NEGOTIATED))


def negotiates(blueprint) -> None:
    """`blueprint`'s URLs answer HTML or JSON by Accept: every answer of theirs says `Vary: Accept`,
    also the ones that came out the same either way this time (the console's login page redirects
    an operator already logged in, whatever they accept; the same URL answers by Accept when
    logged out). web.init_app adds it, in every area, to any answer that asked `wants_json`."""

    @blueprint.after_request
    def _vary_on_accept(response):
        response.vary.add("Accept")
        return response


def keep_private(blueprint, public: tuple[str, ...] = ()) -> None:
    """Every answer of `blueprint`'s views (pages, JSON, redirects, errors raised in them) shows
    or acts on one customer's or operator's own data: `Cache-Control: no-store`, so neither a
    cache in front nor the browser's back button keeps a copy for the next person at that
    address (docs/REFERENCE.md, Routes, Conventions). `public`: endpoints that stay cacheable
    (the catalog)."""

    @blueprint.after_request
    def _no_store(response):
        if request.endpoint not in public:
            response.headers["Cache-Control"] = "no-store"
        return response


@overload
def browser_id(create: Literal[True] = True) -> str: ...
@overload
def browser_id(create: bool) -> str | None: ...
def browser_id(create: bool = True) -> str | None:
    """An opaque id for this browser, kept in the signed session cookie. Orders and carts
    belong to it; another browser sees them only with the order's access token."""
    bid = session.get("bid")
    if bid is not None and not (isinstance(bid, str) and 0 < len(bid) <= 64 and bid.isprintable()):
        bid = None  # not one we made (the cookie is signed, so only with the key): a new browser
        session.pop("bid", None)
    if bid is None and create:
        bid = secrets.token_urlsafe(18)
        session["bid"] = bid
        session.permanent = True
    return bid


def answer_if_later_fails(answer) -> None:
    """Say what to answer if this request fails from here on: called by a route right after its
    use case committed, with a function that builds the response from what the route already
    knows (it must not touch the database). An error after the commit (a connection killed
    under the request, the database gone while the page is rendered) then answers with what was
    done, not an error page: the customer whose order was placed learns its reference."""
    g.answer_after_commit = answer


def answer_after_commit():
    """The answer a route registered with `answer_if_later_fails`, or None."""
    return g.pop("answer_after_commit", None)


def at_address(response, address: str):
    """A refused POST answers with its 4xx and the page it concerns, as docs/REFERENCE.md,
    Storefront, says; the page's own address goes with it (Content-Location, and static/shop.js
    puts it in the address bar) so that a reload or a shared link is the GET page, not the POST."""
    response = make_response(response)
    if response.status_code >= 400:
        response.headers["Content-Location"] = address
    return response
