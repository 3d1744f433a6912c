"""A throwaway database for one benchmark run: a fresh PostgreSQL database on the server that
`url` names (dropped afterwards), or a SQLite file in a temp folder."""

from __future__ import annotations

import tempfile
import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


def make_database(url: str, label: str = "bench"):
    if url.startswith("sqlite"):
        folder = tempfile.mkdtemp(prefix=f"backstop-{label}-")
        return f"sqlite:///{folder}/bench.sqlite3", (lambda: None)
    server = make_url(url)
    name = f"backstop_{label}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop():
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return server.set(database=name).render_as_string(hide_password=False), drop
