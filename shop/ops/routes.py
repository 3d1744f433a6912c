from __future__ import annotations

from flask import Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from ..extensions import csrf, db
from . import bp
from .metrics import registry


@bp.get("/healthz")
def healthz():
    """200 when the database and Redis answer, 503 otherwise, with which one is down."""
    from .. import queue

    checks = {}
    try:
        db.session.execute(text("SELECT 1"))
        db.session.rollback()
        checks["database"] = "ok"
    except Exception as exc:
        db.session.rollback()
        checks["database"] = f"down: {type(exc).__name__}"
    try:
        queue.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"down: {type(exc).__name__}"
    healthy = all(v == "ok" for v in checks.values())
    return jsonify({"status": "ok" if healthy else "degraded", **checks}), 200 if healthy else 503


@bp.get("/metrics")
@csrf.exempt
def metrics():
    """Prometheus text, computed from the database at scrape time."""
    return Response(generate_latest(registry()), mimetype=CONTENT_TYPE_LATEST)
