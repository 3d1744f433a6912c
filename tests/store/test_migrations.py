"""The committed migrations build exactly the schema the models describe, on the database this
run targets (PostgreSQL or SQLite), starting from nothing."""

from __future__ import annotations

import tempfile
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from shop import create_app
from shop.extensions import db
from support import base_config


@pytest.fixture
def fresh_database_url(database_url):
    """An empty database of the same kind as the run's, dropped afterwards."""
    if database_url.startswith("postgresql"):
        server = make_url(database_url)
        name = f"backstop_mig_{uuid.uuid4().hex[:10]}"
        admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield server.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    else:
        folder = tempfile.mkdtemp(prefix="backstop-mig-")
        yield f"sqlite:///{folder}/fresh.sqlite3"


def test_upgrading_an_empty_database_yields_the_models_schema_with_no_autogenerate_diff(fresh_database_url):
    from flask_migrate import upgrade

    app = create_app(base_config(fresh_database_url))
    with app.app_context():
        with db.engine.connect() as conn:
            assert inspect(conn).get_table_names() == []
        upgrade()
        with db.engine.connect() as conn:
            options = dict(app.extensions["migrate"].configure_args)
            options.pop("process_revision_directives", None)
            context = MigrationContext.configure(conn, opts={"compare_type": True, **options})
            diff = compare_metadata(context, db.metadata)
            tables = set(inspect(conn).get_table_names())
            version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        db.engine.dispose()
    assert diff == [], "the models and the migrations disagree:\n" + "\n".join(map(repr, diff))
    assert {t.name for t in db.metadata.sorted_tables} <= tables
    assert version  # stamped at head: `flask db upgrade` on this database is a no-op


def test_the_stock_check_constraint_exists_in_the_migrated_database(fresh_database_url):
    """The database itself refuses negative stock: the last line of defence against oversell."""
    from flask_migrate import upgrade
    from sqlalchemy.exc import IntegrityError

    app = create_app(base_config(fresh_database_url))
    with app.app_context():
        upgrade()
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO products (slug, name, description, created_at) "
                    "VALUES ('p', 'P', '', CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO variants (product_id, sku, name, price, currency) "
                    "SELECT id, 'S', 'V', 100, 'usd' FROM products"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO inventory (variant_id, on_hand, updated_at) "
                    "SELECT id, 1, CURRENT_TIMESTAMP FROM variants"
                )
            )
        with pytest.raises(IntegrityError):
            with db.engine.begin() as conn:
                conn.execute(text("UPDATE inventory SET on_hand = on_hand - 2"))
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT on_hand FROM inventory")).scalar_one() == 1
        db.engine.dispose()


def test_the_late_money_watch_moves_out_of_payment_processing_at_for_cancelled_orders_only(fresh_database_url):
    """Upgrading a database written before the watch had its own column: a cancelled order's mark
    was the sweep's watch and moves; a live order's stays its settling payment."""
    from flask_migrate import upgrade

    app = create_app(base_config(fresh_database_url))
    since = "2026-11-30 10:00:00"
    with app.app_context():
        upgrade(revision="c8e0a2b4d6f9")
        with db.engine.begin() as conn:
            for reference, status in (("MIG-CANCELLED", "Cancelled"), ("MIG-SETTLING", "PaymentInitiated")):
                conn.execute(
                    text(
                        "INSERT INTO orders (reference, access_token, browser_id, email, status, total, currency,"
                        " inventory_restored, payment_attempts, version, created_at, updated_at,"
                        " payment_processing_at) VALUES (:ref, 't', 'b', 'a@example.com', :status, 100, 'usd',"
                        " false, 1, 2, :at, :at, :at)"
                    ),
                    {"ref": reference, "status": status, "at": since},
                )
        upgrade()
        with db.engine.connect() as conn:
            rows = dict(
                (r.reference, (r.payment_processing_at is not None, r.late_money_watch_since is not None))
                for r in conn.execute(
                    text("SELECT reference, payment_processing_at, late_money_watch_since FROM orders")
                )
            )
        db.engine.dispose()
    assert rows == {"MIG-CANCELLED": (False, True), "MIG-SETTLING": (True, False)}


def test_upgrading_backfills_why_and_when_each_cancelled_order_was_cancelled_from_its_last_cancel_event(
    fresh_database_url,
):
    """A database written before the order row said why and when it was cancelled: each cancelled
    order takes its last OrderCancelled event's reason and time; one with no such event, and every
    order that is not cancelled, keeps both empty."""
    import sqlalchemy as sa
    from flask_migrate import upgrade

    from shop.models.types import UTCDateTime

    orders = sa.table(
        "orders",
        *(sa.column(c) for c in ("id", "reference", "access_token", "browser_id", "email", "status", "total")),
        *(sa.column(c) for c in ("currency", "inventory_restored", "payment_attempts", "version")),
        sa.column("created_at", UTCDateTime()),
        sa.column("updated_at", UTCDateTime()),
        sa.column("cancel_reason"),
        sa.column("cancelled_at", UTCDateTime()),
    )
    events = sa.table(
        "outbox_events",
        sa.column("order_id"),
        sa.column("name"),
        sa.column("payload", sa.JSON()),
        sa.column("created_at", UTCDateTime()),
    )
    placed = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)
    at = {n: placed + timedelta(minutes=n) for n in range(1, 6)}
    # reference: (status, [(event, reason, at)]), events in the order they were written
    history = {
        "MIG-CUSTOMER": (
            "Cancelled",
            [("OrderPlaced", None, at[1]), ("OrderCancelled", "cancelled by customer", at[2])],
        ),
        "MIG-EXPIRED": ("Cancelled", [("OrderCancelled", "payment window expired", at[3])]),
        # Two cancel events (a replayed one): the last written wins, though its time is earlier.
        "MIG-TWICE": ("Cancelled", [("OrderCancelled", "first word", at[5]), ("OrderCancelled", "last word", at[4])]),
        "MIG-NO-REASON": ("Cancelled", [("OrderCancelled", None, at[1])]),
        "MIG-NO-EVENT": ("Cancelled", []),
        "MIG-PAID": ("Paid", [("OrderPaid", None, at[2])]),
        "MIG-PENDING": ("PendingPayment", [("OrderPlaced", None, at[1])]),
    }
    app = create_app(base_config(fresh_database_url))
    with app.app_context():
        upgrade(revision="f0a2b4c6d8e1")
        with db.engine.begin() as conn:
            for n, (reference, (status, written)) in enumerate(history.items(), start=1):
                conn.execute(
                    sa.insert(orders).values(
                        id=n, reference=reference, access_token="t", browser_id="b", email="a@example.com",
                        status=status, total=100, currency="usd", inventory_restored=False, payment_attempts=1,
                        version=2, created_at=placed, updated_at=placed,
                    )
                )  # fmt: skip
                for name, reason, when in written:
                    payload = {"order_id": n} if reason is None else {"order_id": n, "reason": reason}
                    conn.execute(sa.insert(events).values(order_id=n, name=name, payload=payload, created_at=when))
        upgrade()
        with db.engine.connect() as conn:
            rows = {
                r.reference: (r.cancel_reason, r.cancelled_at)
                for r in conn.execute(sa.select(orders.c.reference, orders.c.cancel_reason, orders.c.cancelled_at))
            }
        db.engine.dispose()
    assert rows == {
        "MIG-CUSTOMER": ("cancelled by customer", at[2]),
        "MIG-EXPIRED": ("payment window expired", at[3]),
        "MIG-TWICE": ("last word", at[4]),
        "MIG-NO-REASON": (None, at[1]),
        "MIG-NO-EVENT": (None, None),
        "MIG-PAID": (None, None),
        "MIG-PENDING": (None, None),
    }


def test_the_tax_migration_fills_what_orders_paid_before_it_charged(fresh_database_url):
    """Before TAX_MODE every accepted payment charged exactly the order's total without tax: a
    paid order, and a cancelled one whose money was refunded, take tax 0 and their total; an order
    never paid keeps both empty (null until paid)."""
    import sqlalchemy as sa
    from flask_migrate import upgrade

    from shop.models.types import UTCDateTime

    orders = sa.table(
        "orders",
        *(sa.column(c) for c in ("id", "reference", "access_token", "browser_id", "email", "status", "total")),
        *(sa.column(c) for c in ("currency", "inventory_restored", "payment_attempts", "version")),
        sa.column("created_at", UTCDateTime()),
        sa.column("updated_at", UTCDateTime()),
        sa.column("tax"),
        sa.column("charged"),
    )
    refunds = sa.table(
        "refunds",
        *(sa.column(c) for c in ("order_id", "session_id", "amount", "currency", "reason", "status")),
        sa.column("created_at", UTCDateTime()),
        sa.column("updated_at", UTCDateTime()),
    )
    at = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)
    statuses = {
        "TAX-PAID": "Paid",
        "TAX-REFUNDED": "Cancelled",
        "TAX-CANCELLED": "Cancelled",
        "TAX-OPEN": "PendingPayment",
    }
    app = create_app(base_config(fresh_database_url))
    with app.app_context():
        upgrade(revision="b1d3f5a7c9e2")
        with db.engine.begin() as conn:
            for n, (reference, status) in enumerate(statuses.items(), start=1):
                conn.execute(
                    sa.insert(orders).values(
                        id=n, reference=reference, access_token="t", browser_id="b", email="a@example.com",
                        status=status, total=100 * n, currency="usd", inventory_restored=False, payment_attempts=1,
                        version=2, created_at=at, updated_at=at,
                    )
                )  # fmt: skip
            conn.execute(
                sa.insert(refunds).values(
                    order_id=2, session_id="cs_late", amount=200, currency="usd", reason="late money",
                    status="succeeded", created_at=at, updated_at=at,
                )
            )  # fmt: skip
        upgrade()
        with db.engine.connect() as conn:
            rows = {r.reference: (r.tax, r.charged) for r in conn.execute(sa.select(orders))}
        db.engine.dispose()
    assert rows == {
        "TAX-PAID": (0, 100),
        "TAX-REFUNDED": (0, 200),
        "TAX-CANCELLED": (None, None),
        "TAX-OPEN": (None, None),
    }


def _indexes_of_orders(conn) -> set[str]:
    return {ix["name"] for ix in inspect(conn).get_indexes("orders") if ix.get("name")}


def test_the_to_ship_index_migration_applies_and_downgrades(fresh_database_url):
    from flask_migrate import downgrade, upgrade

    app = create_app(base_config(fresh_database_url))
    with app.app_context():
        upgrade(revision="ba90e3581f47")
        with db.engine.connect() as conn:
            before = _indexes_of_orders(conn)
        upgrade(revision="1fd55801e939")
        with db.engine.connect() as conn:
            after = _indexes_of_orders(conn)
        downgrade(revision="ba90e3581f47")
        with db.engine.connect() as conn:
            back = _indexes_of_orders(conn)
        db.engine.dispose()
    assert "ix_orders_to_ship" not in before and "ix_orders_to_ship" in after
    assert back == before


def test_the_to_ship_list_reads_its_partial_index_on_the_migrated_database(fresh_database_url):
    """GET /console/shipping's query, planned on the schema the migrations leave: the planner may
    use ix_orders_to_ship (its predicate is the query's own), so the list is a scan of the orders on
    it, not of every order. Sequential scans are priced out (PostgreSQL), or the index is named
    (SQLite, which refuses a name it cannot use), so an empty table does not hide it."""
    from flask_migrate import upgrade

    from shop.console.ship_actions import to_ship_query

    app = create_app(base_config(fresh_database_url))
    with app.app_context():
        upgrade()
        query = to_ship_query().compile(db.engine, compile_kwargs={"literal_binds": True})
        with db.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SET enable_seqscan = off"))
                plan = "\n".join(conn.execute(text(f"EXPLAIN {query}")).scalars())
            else:  # SQLite refuses INDEXED BY an index the query's terms do not let it use
                forced = str(query).replace("FROM orders", "FROM orders INDEXED BY ix_orders_to_ship", 1)
                plan = "\n".join(str(row[-1]) for row in conn.execute(text(f"EXPLAIN QUERY PLAN {forced}")))
        db.engine.dispose()
    assert "ix_orders_to_ship" in plan, plan
