"""Pooled database connections: a connection that died while it sat in the pool (a PostgreSQL
restart, an idle timeout, a killed backend) is replaced before anyone uses it, and a connection
used a moment ago is handed out without a round trip to check it (shop._configure_idle_ping)."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import create_engine, text

import shop
from shop.extensions import db

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgresql")
pytestmark = pytest.mark.skipif(not ON_POSTGRES, reason="needs a database server whose backends can be killed")


def _backend_pid() -> int:
    pid = db.session.execute(text("SELECT pg_backend_pid()")).scalar_one()
    db.session.commit()  # the connection goes back to the pool
    return pid


def _kill(database_url: str, pid: int) -> None:
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
    admin.dispose()


def test_a_pooled_connection_killed_while_idle_is_replaced_before_use(fresh_app, database_url, monkeypatch):
    with fresh_app.app_context():
        killed = _backend_pid()
        _kill(database_url, killed)
        monkeypatch.setattr(shop, "IDLE_PING_SECONDS", 0.0)  # it has sat idle long enough to be checked

        assert _backend_pid() != killed  # no error: the ping found it dead and the pool replaced it
        db.session.remove()


def test_a_connection_used_a_moment_ago_is_handed_out_unchecked(fresh_app, database_url, monkeypatch):
    """The price of skipping the per-transaction ping: within IDLE_PING_SECONDS of its last use a
    dead connection is found by the statement itself (one failed statement, then the pool is
    renewed). Deliveries and commands retry such a failure; this pins that the ping is skipped."""
    from sqlalchemy.exc import OperationalError

    with fresh_app.app_context():
        killed = _backend_pid()
        _kill(database_url, killed)
        monkeypatch.setattr(shop, "IDLE_PING_SECONDS", 3600.0)

        with pytest.raises(OperationalError):
            _backend_pid()
        db.session.rollback()
        assert _backend_pid() != killed  # the disconnect invalidated the pool: a fresh connection
        db.session.remove()


def _first_connection_warnings(app, caplog) -> list[str]:
    caplog.clear()
    with caplog.at_level("WARNING", logger="shop"), app.app_context():
        db.session.execute(text("SELECT 1"))
        db.session.remove()
    return [r.getMessage() for r in caplog.records if "max_connections" in r.getMessage()]


def test_a_web_that_may_open_more_connections_than_the_server_allows_says_so_when_it_first_connects(
    make_fresh_app, caplog
):
    with make_fresh_app().app_context():
        allowed = int(db.session.execute(text("SHOW max_connections")).scalar_one())
        db.session.remove()
    # Threads enough that WEB_CONCURRENCY x (pool + overflow) reaches the server's limit.
    threads = min(256, allowed // 2)
    big = make_fresh_app(WEB_CONCURRENCY=2, WEB_THREADS=threads)
    assert shop.web_connections(big.config["SETTINGS"]) >= allowed
    [warning] = _first_connection_warnings(big, caplog)
    assert f"PostgreSQL allows {allowed} connections" in warning and f"WEB_THREADS {threads}" in warning
    assert "answer 503" in warning and "PgBouncer" in warning

    default = make_fresh_app()
    assert shop.web_connections(default.config["SETTINGS"]) < allowed
    assert _first_connection_warnings(default, caplog) == []
