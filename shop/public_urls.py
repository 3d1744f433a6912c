"""The shop's own absolute URLs, built from PUBLIC_BASE_URL and nothing a request says.

A request's `Host` (and `X-Forwarded-Host`) is whatever the client sent. An absolute URL built
from it (`url_for(..., _external=True)`, werkzeug's routing redirects) lets a forged header put
another site's address into a page, a Location, an email or the provider's return URLs: a
phishing link that the shop itself hands out. So every absolute URL of the shop is made here,
from `PUBLIC_BASE_URL` (docs/REFERENCE.md, Settings), and the shop's own redirects carry
relative Locations (shop/web/requests.py makes the routing redirects relative too).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import current_app


def public_url(path: str) -> str:
    """`PUBLIC_BASE_URL` + `path`: the shop's address of `path` (relative to the app's root,
    starting with "/", query included). Usable in a request, a worker and the CLI alike."""
    if not path.startswith("/"):
        raise ValueError(f"a path inside the shop starts with '/', got {path!r}")
    return current_app.config["PUBLIC_BASE_URL"] + path


def public_url_for(endpoint: str, **values) -> str:
    """`url_for(endpoint, **values)` made absolute at `PUBLIC_BASE_URL`, in or out of a request
    (the URL map bound to no host: no request's Host can reach it)."""
    return public_url(current_app.url_map.bind("", script_name="/").build(endpoint, values))


def relative_location(url: str, script_root: str = "") -> str:
    """The path and query of `url`, an absolute URL of this shop that a request's Host built:
    what a Location should say instead. A path that a browser would read as another host
    (`//host`, `/\\host`) is made absolute at `PUBLIC_BASE_URL` instead."""
    parts = urlsplit(url)
    location = parts.path or "/"
    if parts.query:
        location += "?" + parts.query
    if location.startswith(("//", "/\\")):
        return public_url("/" + location.removeprefix(script_root).lstrip("/\\"))
    return location
