from __future__ import annotations

import hmac
import logging

from flask import Response, current_app, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError

from ..extensions import csrf, db
from .blueprint import bp
from .health import snapshot
from .metrics import registry

log = logging.getLogger("shop.ops")


@bp.get("/healthz")
def healthz():
    """200 when the database and Redis answer, a worker and the scheduler beat within
    HEALTH_STALE_SECONDS and no due outbox item waits too long; otherwise 503 with each reason in
    words. Never asks the provider."""
    found = snapshot()
    body = {"status": "ok" if found["healthy"] else "degraded", **found["checks"], "problems": found["problems"]}
    return jsonify(body), 200 if found["healthy"] else 503


@bp.get("/metrics")
@csrf.exempt
def metrics():
    """Prometheus text, computed from the database at scrape time. With the database down the
    scrape fails with a 503 in words (Prometheus records the target as down), not a 500. With
    METRICS_TOKEN set, only a scraper that sends it as a Bearer token gets them; anyone else a 401."""
    if not _scraper_may_read():
        return Response(
            "unauthorized: /metrics needs Authorization: Bearer <METRICS_TOKEN>\n",
            status=401,
            mimetype="text/plain",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        body = generate_latest(registry())
    except SQLAlchemyError as exc:
        db.session.rollback()
        log.warning("metrics: database unreachable: %s", exc)
        return Response(f"database unreachable: {type(exc).__name__}\n", status=503, mimetype="text/plain")
    # content_type, not mimetype: the constant already names its charset, and mimetype= would
    # append a second one, which strict scrapers refuse to parse.
    return Response(body, content_type=CONTENT_TYPE_LATEST)


def _scraper_may_read() -> bool:
    token = current_app.config.get("METRICS_TOKEN")
    if not token:
        return True  # unset: open, as before
    scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
    # Bytes, compared in constant time: the sender's text may hold anything, and how long a wrong
    # guess takes to refuse must not tell how much of it was right.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
