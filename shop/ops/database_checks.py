"""The preflight's database lines (`flask shop check`, docs/REFERENCE.md, Commands): reachable and
migrated (`database`), its clock against this machine's (`clock`), and what the web's pools may open
against its connection limit (`pools`), over one connection of its own with short timeouts."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from flask import current_app

from ..connections import engine_options, pooler_client_limit, server_limit, web_connections
from .checks import FAIL, OK, TIMEOUT_SECONDS, WARN, Check, first_line

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

# Deadlines, leases and heartbeats are written by one machine's clock and read against another's
# (or the database's): beyond this, a lease looks lapsed early or a deadline late.
CLOCK_TOLERANCE_SECONDS = 2.0


class DatabaseChecks:
    """One connection of its own (short connect and statement timeouts), kept for the checks that
    need the database after the first."""

    def __init__(self):
        self.settings = current_app.config["SETTINGS"]
        self.url = current_app.config["SQLALCHEMY_DATABASE_URI"]
        self.sqlite = self.url.startswith("sqlite")
        self.engine: Engine | None = None
        self.conn: Connection | None = None
        self.problem = None  # why the checks after the first are skipped

    def _connect(self):
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        args: dict[str, Any]
        if self.sqlite:
            args = {"timeout": TIMEOUT_SECONDS}
        else:
            args = {"connect_timeout": math.ceil(TIMEOUT_SECONDS)}
            if self.settings.database_pooler == "pgbouncer":
                args["prepare_threshold"] = None  # and no startup options: PgBouncer refuses them
            else:
                args["options"] = f"-c statement_timeout={int(TIMEOUT_SECONDS * 1000)}"
        self.engine = create_engine(self.url, poolclass=NullPool, connect_args=args)
        self.conn = self.engine.connect()

    def where(self) -> str:
        from sqlalchemy.engine import make_url

        url = make_url(self.url)
        if self.sqlite:
            return f"SQLite {url.database}"
        return f"PostgreSQL {url.host or 'localhost'}:{url.port or 5432}/{url.database}"

    def check(self) -> Check:
        try:
            self._connect()
        except Exception as error:  # noqa: BLE001 - any failure to connect is this line's answer
            self.problem = "the database is not reachable"
            return Check(
                "database",
                FAIL,
                f"{self.where()} not reachable within {TIMEOUT_SECONDS:g} s: {first_line(error)} "
                "(check DATABASE_URL, the server, and the network between them)",
            )
        try:
            at, heads = self._revisions()
        except Exception as error:  # noqa: BLE001
            self.problem = "the database did not answer"
            self._close_connection()
            return Check("database", FAIL, f"{self.where()}: could not read its migration: {first_line(error)}")
        head = ", ".join(heads)
        if at == heads:
            return Check("database", OK, f"reachable ({self.where()}), migrations at head ({head})")
        self.problem = "the database's migrations are not at head"
        if not at:
            return Check(
                "database",
                FAIL,
                f"reachable ({self.where()}), but no migration applied (head is {head}): run `flask db upgrade`",
            )
        if set(at) - set(self._known()):
            return Check(
                "database",
                FAIL,
                f"reachable ({self.where()}), at {', '.join(at)}, a migration this release does not have (head "
                f"is {head}): a newer release migrated it; deploy that release, or downgrade with the one that did",
            )
        return Check(
            "database",
            FAIL,
            f"reachable ({self.where()}), at {', '.join(at)}, behind the head {head}: run `flask db upgrade`",
        )

    def _scripts(self):
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        config = Config()
        config.set_main_option("script_location", current_app.extensions["migrate"].directory)
        return ScriptDirectory.from_config(config)

    def _known(self) -> list[str]:
        return [script.revision for script in self._scripts().walk_revisions()]

    def _revisions(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        from alembic.runtime.migration import MigrationContext

        logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)  # "Context impl ...": noise here
        conn = self.conn
        assert conn is not None, "check() reads the revisions right after connecting"
        at = tuple(sorted(MigrationContext.configure(conn).get_current_heads()))
        conn.rollback()
        return at, tuple(sorted(self._scripts().get_heads()))

    def _skipped(self, name: str) -> Check:
        return Check(name, FAIL, f"skipped: {self.problem} (see database)")

    def clock(self, clock) -> Check:
        if self.sqlite:
            return Check("clock", OK, "skipped: SQLite shares this machine's clock")
        if self.conn is None:
            return self._skipped("clock")
        from sqlalchemy import text

        try:
            before = clock()
            theirs = float(self.conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
            after = clock()
            self.conn.rollback()
        except Exception as error:  # noqa: BLE001
            self._close_connection()
            self.problem = "the database did not answer"
            return Check("clock", FAIL, f"could not read the database's clock: {first_line(error)}")
        return judge_clock(theirs - (before + after) / 2, after - before)

    def pools(self) -> Check:
        settings = self.settings
        if self.sqlite:
            return Check("pools", OK, "SQLite: no server connection limit to fit in")
        if self.conn is None:
            return self._skipped("pools")
        pool = engine_options(settings)
        wanted = web_connections(settings)
        sizes = (
            f"the web may open {wanted} connections (WEB_CONCURRENCY {settings.web_concurrency} x a pool of "
            f"{pool['pool_size']} + {pool['max_overflow']} for WEB_THREADS {settings.web_threads})"
        )
        if settings.database_pooler == "pgbouncer":
            allowed, what = pooler_client_limit(self.url), "PgBouncer allows {} clients (max_client_conn)"
            remedy = "raise max_client_conn"
            if allowed is None:
                return Check(
                    "pools",
                    WARN,
                    f"{sizes}; PgBouncer's max_client_conn could not be read from its admin console (this user "
                    "is not in its admin_users or stats_users: see the log line above): compare them yourself",
                )
        else:
            allowed = server_limit(self.conn.connection.dbapi_connection)
            what = "PostgreSQL allows {} (max_connections)"
            remedy = "raise max_connections, or put PgBouncer in front (DATABASE_POOLER)"
            self.conn.rollback()
            if allowed is None:
                return Check("pools", WARN, f"{sizes}; could not read max_connections: compare them yourself")
        if wanted >= allowed:
            return Check(
                "pools",
                FAIL,
                f"{sizes}, besides the worker and the scheduler, and {what.format(allowed)}: during a burst, "
                f"requests that find no connection answer 503. Lower WEB_THREADS or WEB_CONCURRENCY, or {remedy} "
                "(README, Sizing the web)",
            )
        return Check("pools", OK, f"{sizes}; {what.format(allowed)}")

    def _close_connection(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - closing what failed; nothing to report
                pass
            self.conn = None

    def close(self) -> None:
        self._close_connection()
        if self.engine is not None:
            self.engine.dispose()


def judge_clock(offset: float, round_trip: float) -> Check:
    """`offset`: the database's clock minus this machine's, in seconds, measured over a round trip
    of `round_trip` seconds (the measure's uncertainty)."""
    words = f"{abs(offset):.1f} s {'behind' if offset > 0 else 'ahead of'} the database's"
    if abs(offset) - round_trip / 2 > CLOCK_TOLERANCE_SECONDS:
        return Check(
            "clock",
            FAIL,
            f"this machine's clock is {words} (at most {CLOCK_TOLERANCE_SECONDS:g} s): deadlines, leases and "
            "heartbeats are read against both; sync both machines with NTP (chrony, systemd-timesyncd)",
        )
    return Check("clock", OK, f"this machine's clock is {words}")
