"""Through a real PgBouncer in transaction pooling mode (Debian's package; 1.18 cannot track
prepared statements), started by the test in front of the test's PostgreSQL: with
DATABASE_POOLER=pgbouncer (docs/REFERENCE.md, Settings) the shop prepares nothing on the server,
so a transaction may land on any server connection; without it the same traffic breaks. The
shop's own flows (checkout, a paid webhook, a cancel and its compensation, a deadline, the sweep's
lease) then run through it, with real worker and scheduler processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from factories import on_hand, place_order_for, seed_catalog_rows
from payment_helpers import WEBHOOK_SECRET, Shopper, paid_at_provider, post_webhook
from process_support import Processes, free_port, process_env
from shop.extensions import db
from shop.models import CycleStatus, Order, ReconciliationCycle
from support import wait_until

pytestmark = pytest.mark.slow

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@pytest.fixture
def pgbouncer(database_url, is_postgres):
    """A PgBouncer in transaction pooling mode on a free port, forwarding every database name to
    the run's PostgreSQL, with two server connections per database (so transactions of several
    clients share them) and the run's user as its admin; yields DATABASE_URL through it."""
    if not is_postgres:
        pytest.skip("PgBouncer stands in front of PostgreSQL; this run is on SQLite")
    if not os.path.exists(PGBOUNCER):
        pytest.skip("pgbouncer is not installed (Debian's package pgbouncer)")
    server = make_url(database_url)
    user = server.username or "postgres"
    port = free_port()
    folder = tempfile.mkdtemp(prefix="backstop-pgbouncer-")
    os.chmod(folder, 0o777)  # PgBouncer drops root for `user` and writes its log and pid here
    with open(os.path.join(folder, "users.txt"), "w") as f:
        f.write(f'"{user}" ""\n')
    ini = os.path.join(folder, "pgbouncer.ini")
    with open(ini, "w") as f:
        f.write(
            f"[databases]\n* = host={server.host or '127.0.0.1'} port={server.port or 5432}\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {folder}/users.txt\nadmin_users = {user}\n"
            "pool_mode = transaction\ndefault_pool_size = 2\nmax_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n"
        )
    command = [PGBOUNCER] + (["-u", user] if os.geteuid() == 0 else []) + [ini]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers(port), 10, "PgBouncer to listen", lambda: _log(folder))
        yield server.set(port=port).render_as_string(hide_password=False), folder
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _log(folder: str) -> str:
    try:
        with open(os.path.join(folder, "pgbouncer.log"), errors="replace") as f:
            return f.read()[-3000:]
    except OSError:
        return ""


def _alternate(app, rounds: int) -> None:
    """Two pooled connections taking turns, one short transaction each, the same statement every
    time: how a web process's threads meet PgBouncer."""
    with app.app_context():
        with db.engine.connect() as one, db.engine.connect() as two:
            for i in range(rounds):
                for conn in (one, two):
                    assert conn.execute(text("SELECT count(*) + :i FROM orders"), {"i": i}).scalar() == i
                    conn.commit()


def test_without_the_setting_statements_prepared_through_transaction_pooling_break(make_fresh_app, pgbouncer):
    """The case the setting exists for: psycopg prepares a statement on the server after a few
    executions, and the next transaction of another client meets it on the same server connection
    (or misses its own on another)."""
    url, _ = pgbouncer
    app = make_fresh_app(DATABASE_URL=url, DATABASE_POOLER="none")
    with pytest.raises(DBAPIError, match="prepared statement"):
        _alternate(app, 20)


def test_with_the_setting_nothing_is_prepared_and_the_same_traffic_runs(make_fresh_app, pgbouncer):
    url, folder = pgbouncer
    app = make_fresh_app(DATABASE_URL=url, DATABASE_POOLER="pgbouncer")
    _alternate(app, 50)
    assert "prepared statement" not in _log(folder)


def test_the_connection_check_reads_pgbouncers_client_limit_not_postgresqls(make_fresh_app, pgbouncer, caplog):
    url, _ = pgbouncer
    app = make_fresh_app(DATABASE_URL=url, DATABASE_POOLER="pgbouncer", WEB_CONCURRENCY=16, WEB_THREADS=32)
    from shop import _pooler_client_limit, web_connections

    assert _pooler_client_limit(url) == 500
    assert web_connections(app.config["SETTINGS"]) >= 500  # 16 x (32 + 10): more than the pooler takes
    with caplog.at_level("WARNING", logger="shop"), app.app_context():
        db.engine.dispose()
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    assert any("PgBouncer allows 500 clients (max_client_conn)" in r.getMessage() for r in caplog.records)


def test_flask_shop_check_compares_the_web_pools_with_pgbouncers_client_limit(make_fresh_app, sandbox, pgbouncer):
    """`flask shop check` through the pooler: the database's lines are answered through it, and the
    pools line compares the web with PgBouncer's max_client_conn (500 here), not max_connections."""
    url, _ = pgbouncer
    fits = make_fresh_app(DATABASE_URL=url, DATABASE_POOLER="pgbouncer", STRIPE_API_BASE=sandbox.base_url)
    too_many = make_fresh_app(
        DATABASE_URL=url, DATABASE_POOLER="pgbouncer", STRIPE_API_BASE=sandbox.base_url, WEB_CONCURRENCY=16
    )

    fits_out = fits.test_cli_runner().invoke(args=["shop", "check"]).output
    too_many_out = too_many.test_cli_runner().invoke(args=["shop", "check"]).output

    assert "ok    database: reachable (PostgreSQL 127.0.0.1:" in fits_out and "migrations at head" in fits_out
    assert "ok    clock: " in fits_out
    assert "ok    pools: the web may open 84 connections" in fits_out
    assert "; PgBouncer allows 500 clients (max_client_conn)" in fits_out
    assert "FAIL  pools: the web may open 672 connections (WEB_CONCURRENCY 16 x a pool of 32 + 10" in too_many_out
    assert "PgBouncer allows 500 clients (max_client_conn)" in too_many_out and "raise max_client_conn" in too_many_out


def test_checkout_webhook_compensation_deadline_and_sweep_run_through_pgbouncer(make_fresh_app, sandbox, pgbouncer):
    url, folder = pgbouncer
    window = 3
    app = make_fresh_app(
        DATABASE_URL=url,
        DATABASE_POOLER="pgbouncer",
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET,
        STRIPE_SESSION_MIN_SECONDS=60,
        UNPAID_ORDER_EXPIRY_SECONDS=window,
        RECONCILIATION_STUCK_AGE_SECONDS=window,
    )
    skus = seed_catalog_rows(app)
    shopper = Shopper(app, skus)
    stock = on_hand("NB-A5-DOT", app)

    paid, completed = paid_at_provider(shopper, sandbox)  # checkout through the web, paid at the provider
    assert post_webhook(app.test_client(), completed).status_code == 200
    cancelled = shopper.place()
    assert shopper.cancel(cancelled["reference"], cancelled["version"]).status_code == 200
    with app.app_context():  # placed, never paid: its deadline cancels it
        abandoned = {"reference": place_order_for({"NB-A5-DOT": 1}).reference}
        db.session.remove()

    procs = Processes()
    env = process_env(
        app,
        window=window,
        DATABASE_POOLER="pgbouncer",
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET,
    )
    try:
        procs.start("worker", ["shop", "worker"], env)
        procs.start("scheduler", ["shop", "scheduler"], env)

        def settled() -> bool:
            with app.app_context():
                rows = {
                    o.reference: o
                    for o in db.session.query(Order).filter(
                        Order.reference.in_([cancelled["reference"], abandoned["reference"]])
                    )
                }
                db.session.remove()
            return all(o.status == "Cancelled" and o.inventory_restored for o in rows.values())

        wait_until(settled, 30 + window, "the cancel's and the deadline's stock back", procs.logs)

        def swept() -> bool:  # the scheduler's start-up sweep: its lease and cycle record, through the pooler
            with app.app_context():
                found = db.session.query(ReconciliationCycle).filter_by(status=CycleStatus.OK).count()
                db.session.remove()
            return found > 0

        wait_until(swept, 30, "a sweep cycle that ended ok", procs.logs)
        with app.app_context():
            assert on_hand("NB-A5-DOT") == stock - 1
            assert db.session.query(Order).filter_by(reference=paid["reference"]).one().status == "Paid"
            db.session.remove()
        logs = procs.logs_when_stopped()
    finally:
        procs.stop()
    assert "prepared statement" not in logs and "prepared statement" not in _log(folder)
