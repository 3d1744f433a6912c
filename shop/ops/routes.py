from __future__ import annotations

import hmac
import ipaddress
import logging
import threading
from urllib.parse import urlsplit

from flask import Response, current_app, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError

from .. import clock
from ..connections import reads_only
from ..extensions import csrf, db, per_app
from .blueprint import bp
from .health import snapshot
from .metrics import registry

log = logging.getLogger("shop.ops")

# How long one process reuses a scrape's text, so that scrapes in a row (several Prometheus
# servers, a dashboard) run the database's aggregates once. Not a setting: a test app sets its own
# (config METRICS_CACHE_SECONDS).
CACHE_SECONDS = 5.0

CLOSED = (
    "forbidden: /metrics is closed on a shop whose PUBLIC_BASE_URL is not this machine and that has no "
    "METRICS_TOKEN; set METRICS_TOKEN and give it to the scraper, or METRICS_PUBLIC=1 to open it to anyone\n"
)


@bp.get("/healthz")
@reads_only
def healthz():
    """200 when the database and Redis answer, a worker and the scheduler beat within
    HEALTH_STALE_SECONDS and no due outbox item waits too long; otherwise 503 with each reason in
    words. Never asks the provider."""
    found = snapshot()
    body = {"status": "ok" if found["healthy"] else "degraded", **found["checks"], "problems": found["problems"]}
    return jsonify(body), 200 if found["healthy"] else 503


@bp.get("/metrics")
@csrf.exempt
@reads_only
def metrics():
    """Prometheus text, computed from the database at scrape time (reused by this process for
    METRICS_CACHE_SECONDS: the aggregates scan whole tables). With the database down the scrape
    fails with a 503 in words (Prometheus records the target as down), not a 500. With
    METRICS_TOKEN set, only a scraper that sends it as a Bearer token gets them; anyone else a 401.
    Without it, a shop on a public address answers 403 unless METRICS_PUBLIC opens it."""
    token = current_app.config.get("METRICS_TOKEN")
    if not token and not (current_app.config.get("METRICS_PUBLIC") or _local_shop()):
        return Response(CLOSED, status=403, mimetype="text/plain")
    if token and not _bearer_is(token):
        return Response(
            "unauthorized: /metrics needs Authorization: Bearer <METRICS_TOKEN>\n",
            status=401,
            mimetype="text/plain",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        body = _scrape()
    except SQLAlchemyError as exc:
        db.session.rollback()
        log.warning("metrics: database unreachable: %s", exc)
        return Response(f"database unreachable: {type(exc).__name__}\n", status=503, mimetype="text/plain")
    # content_type, not mimetype: the constant already names its charset, and mimetype= would
    # append a second one, which strict scrapers refuse to parse.
    return Response(body, content_type=CONTENT_TYPE_LATEST)


class _Cached:
    """One process's latest scrape: one thread computes it while the others wait for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.body = b""
        self.until = float("-inf")


def _scrape() -> bytes:
    keep = float(current_app.config.get("METRICS_CACHE_SECONDS", CACHE_SECONDS))
    if keep <= 0:
        return generate_latest(registry())
    cached = per_app("metrics_cache", _Cached)
    with cached.lock:
        if clock.current().monotonic() >= cached.until:
            cached.body = generate_latest(registry())
            cached.until = clock.current().monotonic() + keep
        return cached.body


def _local_shop() -> bool:
    """PUBLIC_BASE_URL names this machine (loopback or localhost): a shop nobody else reaches,
    such as a developer's; any other address is a shop on the internet."""
    host = urlsplit(current_app.config["PUBLIC_BASE_URL"]).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bearer_is(token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
    # Bytes, compared in constant time: the sender's text may hold anything, and how long a wrong
    # guess takes to refuse must not tell how much of it was right.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
