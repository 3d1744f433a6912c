"""The database connections a process opens (the pool of every app's engine), how a transaction
begins on SQLite, and the limits of the server in front of them: PostgreSQL's max_connections,
or PgBouncer's max_client_conn. Every process compares the two when it first connects
(shop/__init__.py), and `flask shop check` in its `pools` line (shop/ops/preflight.py)."""

from __future__ import annotations

import logging
from typing import Any

from flask import current_app, has_request_context, request

from .settings import Settings

# The attribute `reads_only` sets on a view function.
READS_ONLY = "backstop_reads_only"


def engine_options(settings: Settings) -> dict[str, Any]:
    if settings.database_url.startswith("sqlite"):
        # Many threads and processes share one file: wait for the write lock instead of failing.
        return {"connect_args": {"timeout": 30, "check_same_thread": False}}
    # No pool_pre_ping: it costs a round trip on every checkout, i.e. every transaction.
    # `_configure_idle_ping` (shop/__init__.py) pings only connections that sat idle long enough to have died.
    # A connection for every web thread, so no request waits for one (connections are opened on
    # demand: a thread waiting on the provider holds none, see payments.start.start_payment),
    # and overflow for the few threads a process runs besides them (a worker's drain threads).
    options: dict[str, Any] = {"pool_size": max(10, settings.web_threads), "max_overflow": 10}
    if settings.database_pooler == "pgbouncer":
        # Transaction pooling hands each transaction whichever server connection is free, so a
        # statement psycopg prepared on one server connection (it does after five executions) is
        # missing on the next, or another client's of the same name is found there. No
        # server-side prepared statements: every statement goes as a plain query.
        options["connect_args"] = {"prepare_threshold": None}
    return options


def reads_only(view):
    """Marks a view that only reads (/healthz, /metrics, the console's dashboard): on SQLite its
    GET begins without asking for the write lock, so a process frozen inside its write
    transaction (SIGSTOP, a debugger) does not hold up the pages that show it, and a write from
    it is refused at once ("attempt to write a readonly database") instead of waiting for the
    lock. PostgreSQL's readers never wait for a writer: there it changes nothing."""
    setattr(view, READS_ONLY, True)
    return view


def _request_reads_only() -> bool:
    if not has_request_context() or request.method not in ("GET", "HEAD"):
        return False
    return getattr(current_app.view_functions.get(request.endpoint or ""), READS_ONLY, False)


def configure_sqlite(app) -> None:
    """SQLite as a multi-process demo database: WAL so readers do not block the writer, and
    BEGIN IMMEDIATE so a transaction takes the write lock up front and waits for it (busy
    timeout) instead of failing halfway when two writers meet; a view marked `reads_only`
    begins a plain, read-only transaction instead, which waits for no writer."""
    from sqlalchemy import event

    from .extensions import db

    if not app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        return
    with app.app_context():
        engine = db.engine

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # let SQLAlchemy's begin event issue BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        reading = _request_reads_only()
        # The connection's mode is noted in its info: a transaction that writes on one at rest
        # (writable, see _on_checkin) sends nothing more than it ever did.
        if conn.info.get(READS_ONLY, False) != reading:
            conn.exec_driver_sql(f"PRAGMA query_only={int(reading)}")
            conn.info[READS_ONLY] = reading
        conn.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_conn, record):
        # Back in the pool writable: what a transaction sends never depends on which pooled
        # connection it gets.
        if record.info.pop(READS_ONLY, False) and dbapi_conn is not None:
            dbapi_conn.execute("PRAGMA query_only=0")


def web_connections(settings: Settings) -> int:
    """The most connections the web processes together may open (each pool opens on demand)."""
    options = engine_options(settings)
    return settings.web_concurrency * (options["pool_size"] + options["max_overflow"])


def server_limit(dbapi_conn) -> int | None:
    try:
        cursor = dbapi_conn.cursor()
        cursor.execute("SHOW max_connections")
        allowed = int(cursor.fetchone()[0])
        cursor.close()
        return allowed
    except Exception:  # noqa: BLE001 - a check, not a reason to fail the connection
        return None


def pooler_client_limit(database_url: str) -> int | None:
    """PgBouncer's max_client_conn, read from its admin console (the `pgbouncer` database, which
    answers SHOW CONFIG to a user in its admin_users or stats_users). Behind a pooler,
    PostgreSQL's max_connections is the wrong number: the pooler multiplexes clients onto fewer
    server connections. None, logged, when the console does not answer this user."""
    import psycopg  # the driver itself, here only: the app factory loads no database code at import
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    try:
        with psycopg.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 5432,
            user=url.username,
            password=url.password,
            dbname="pgbouncer",
            autocommit=True,
            prepare_threshold=None,
            connect_timeout=5,
        ) as conn:
            for row in conn.execute("SHOW CONFIG").fetchall():
                if row[0] == "max_client_conn":
                    return int(row[1])
    except Exception as error:  # noqa: BLE001 - a check, not a reason to fail the connection
        logging.getLogger("shop").info(
            "could not read PgBouncer's max_client_conn from its admin console (%s): the web's "
            "connections are not checked against it",
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
        )
    return None
