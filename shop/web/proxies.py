"""Which client a request is for: `request.remote_addr`, the one address every per-address limit
(the storefront's return page, the console's login) and every log line reads. Set here, before
the app sees the request, from who connected and what the proxies it trusts said
(docs/REFERENCE.md, Settings: `TRUSTED_PROXIES`).

Behind a balancer every request connects from the balancer: counted by that address, one client's
31 return pages a minute made the page a 429 for every customer, and 20 failed logins shut every
operator out. A balancer says whom it served in X-Forwarded-For, appending the address that
connected to it; a client may send the header too, with anything in it, so only what trusted
proxies appended is believed:

- `hops` (`TRUSTED_PROXIES=1`, a platform's router): the address that many entries from the end,
  werkzeug's ProxyFix rule (`x_for=hops`); a header with fewer entries did not come through them
  all, and the peer stays the client.
- `networks`: from the peer leftwards, each address in a trusted network hands on to the entry
  before it; the first one outside them is the client (nginx's `real_ip_recursive`).

Behind the shop's own front (`flask shop web`, `flask shop up`; BEHIND_FRONT) nginx has already
applied TRUSTED_PROXIES and overwritten the header with its answer (deploy/nginx.conf), so here
only its own loopback requests are believed: ClientAddressFromFront."""

from __future__ import annotations

import ipaddress

from werkzeug.http import parse_list_header

from ..settings_values import TrustedProxies

LOOPBACK_PEERS = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})


def _entries(forwarded: str | None) -> list[str]:
    # werkzeug's own reading of the header (ProxyFix's): empty entries are no entries.
    return parse_list_header(forwarded) if forwarded else []


def _trusted(address: str, trust: TrustedProxies) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return any(parsed in network for network in trust.networks)


def client_address(peer: str, forwarded: str | None, trust: TrustedProxies) -> str:
    """The client of a request from `peer` carrying X-Forwarded-For `forwarded` (see the module)."""
    entries = _entries(forwarded)
    if trust.hops:
        found = entries[-trust.hops] if len(entries) >= trust.hops else ""
        return found or peer
    client = peer
    while entries and _trusted(client, trust):
        client = entries.pop()
    return client


class ClientAddressFromTrustedProxies:
    """WSGI middleware: REMOTE_ADDR becomes client_address(); the peer is kept in the environ
    (`backstop.peer_addr`)."""

    def __init__(self, wsgi_app, trust: TrustedProxies):
        self.wsgi_app, self.trust = wsgi_app, trust

    def __call__(self, environ, start_response):
        peer = environ.get("REMOTE_ADDR") or ""
        client = client_address(peer, environ.get("HTTP_X_FORWARDED_FOR"), self.trust)
        if client != peer:
            environ["backstop.peer_addr"] = peer
            environ["REMOTE_ADDR"] = client
        return self.wsgi_app(environ, start_response)


class ClientAddressFromFront:
    """Behind the shop's own front every request comes from 127.0.0.1, and the client's address is
    the one X-Forwarded-For nginx sets: it overwrites whatever arrived with the client it found
    (the connecting address, or per TRUSTED_PROXIES), so the header holds one address nobody
    before nginx chose. Only for a loopback peer: a request that reached gunicorn from anywhere
    else did not come through the front, and its headers say nothing. Only the last address
    counts, so a front that appended instead would still not let a client pick its address."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        forwarded = environ.get("HTTP_X_FORWARDED_FOR")
        if forwarded and environ.get("REMOTE_ADDR") in LOOPBACK_PEERS:
            client = forwarded.rsplit(",", 1)[-1].strip()
            if client:
                environ["backstop.peer_addr"] = environ["REMOTE_ADDR"]
                environ["REMOTE_ADDR"] = client
        return self.wsgi_app(environ, start_response)


def install(app) -> None:
    """The one of the two the app's place calls for; none when nobody is trusted."""
    trust = app.config.get("TRUSTED_PROXIES") or TrustedProxies()
    if app.config.get("BEHIND_FRONT"):
        app.wsgi_app = ClientAddressFromFront(app.wsgi_app)
    elif trust.hops or trust.networks:
        app.wsgi_app = ClientAddressFromTrustedProxies(app.wsgi_app, trust)
