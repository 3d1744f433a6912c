"""A process frozen inside its write transaction (SIGSTOP, a debugger, a paused VM) holds every
other writer up, on SQLite the whole database's write lock: /healthz, /metrics and the console's
dashboard, the pages an operator reads to find that process, still answer at once, from what was
committed (docs/REFERENCE.md, Operations). On SQLite they begin their transactions without asking
for the write lock, and a write from one of them is refused outright rather than left to wait."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy.exc import OperationalError

import shop.connections as connections
from shop.extensions import db
from support import leave_heartbeats, log_in

JSON = {"Accept": "application/json"}
# Far below SQLite's busy timeout (30 s), far above what a page takes here.
ANSWER_WITHIN_SECONDS = 10


def _prove_the_write_lock_is_held(app, is_postgres: bool) -> None:
    """Another writer that will not wait is refused: the frozen transaction really holds it."""
    url = app.config["SQLALCHEMY_DATABASE_URI"]
    if is_postgres:
        with db.engine.connect() as other:
            other.exec_driver_sql("SET lock_timeout = '200ms'")
            with pytest.raises(OperationalError, match="lock timeout"):
                other.exec_driver_sql("LOCK TABLE orders IN ROW EXCLUSIVE MODE")
        return
    other = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()


def test_a_writer_frozen_in_its_transaction_holds_up_neither_healthz_nor_metrics_nor_the_dashboard(
    make_fresh_app, is_postgres
):
    app = make_fresh_app(METRICS_PUBLIC="1")
    client = app.test_client()
    log_in(app, client)
    leave_heartbeats(app)
    with app.app_context():
        frozen = db.engine.connect()
        frozen.begin()  # on SQLite BEGIN IMMEDIATE: the database's write lock, taken and kept
        if is_postgres:  # writers wait for it, readers do not
            frozen.exec_driver_sql("LOCK TABLE orders, outbox_deliveries IN EXCLUSIVE MODE")
        try:
            _prove_the_write_lock_is_held(app, is_postgres)
            with ThreadPoolExecutor(1) as pool:
                health = pool.submit(client.get, "/healthz").result(timeout=ANSWER_WITHIN_SECONDS)
                board = pool.submit(client.get, "/console/", headers=JSON).result(timeout=ANSWER_WITHIN_SECONDS)
                scrape = pool.submit(client.get, "/metrics").result(timeout=ANSWER_WITHIN_SECONDS)
        finally:
            frozen.rollback()
            frozen.close()
    assert health.status_code == 200, health.get_json()
    assert health.get_json()["database"] == "ok"
    assert board.status_code == 200 and board.get_json()["processes"], board.get_data(as_text=True)
    assert scrape.status_code == 200 and b"shop_orders_stuck" in scrape.data


def test_a_page_that_reads_only_is_refused_a_write_on_sqlite(make_fresh_app, is_postgres, caplog):
    if is_postgres:
        pytest.skip("PostgreSQL's readers never wait for a writer: its pages begin as they always do")
    app = make_fresh_app()

    @connections.reads_only
    def writes_anyway():
        db.session.execute(db.text("UPDATE variants SET price = price"))
        return "written"

    app.add_url_rule("/reads-only-but-writes", view_func=writes_anyway)
    r = app.test_client().get("/reads-only-but-writes")
    # The database's refusal, answered as every database error is (a 503 in words) and logged.
    assert r.status_code == 503, r.get_data(as_text=True)
    assert any("attempt to write a readonly database" in rec.getMessage() for rec in caplog.records)
    # The connection a reading page leaves in the pool writes again for the next transaction.
    with app.app_context():
        db.engine.dispose()
        assert app.test_client().get("/healthz").status_code in (200, 503)
        assert db.engine.pool.checkedin() == 1  # the one connection the page used, back in the pool
        db.session.execute(db.text("UPDATE variants SET price = price"))
        db.session.commit()
