"""Shared fixtures (and the run's hooks) only: helpers live in support.py, row builders in
factories.py, and no test module imports from here. Real PostgreSQL (when DATABASE_URL names
one) or SQLite, real Redis, and the Stripe sandbox as a real HTTP server. Each pytest session
gets its own database and its own Redis database, so runs never see each other's rows or jobs.

A fixture that wipes a store says so in its name: `truncated_db` empties every table,
`flushed_redis` flushes the run's Redis database, and everything built on both is `fresh_`
(`make_fresh_app`, `fresh_app`, `fresh_client`, `fresh_ctx`, `fresh_paying_app`). The storefront's
tests start from `shop` (or build theirs with `make_shop`): fresh, with the demo catalog."""

from __future__ import annotations

import contextlib
import os
import tempfile

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from factories import place_order_for, seed_catalog_rows
from lane_priority import serving, step_down_from_environment
from payment_helpers import WEBHOOK_SECRET, Shopper, live_shop
from shop import clock as shop_clock
from shop import create_app
from shop.extensions import db
from support import (
    LOCK_SECONDS,
    LOCKS_URL,
    RUN_ID,
    UNREACHABLE_PROVIDER,
    FakeClock,
    _claimed,
    base_config,
    log_in,
    redis_url,
)


def pytest_configure(config):
    step_down_from_environment()
    config.addinivalue_line("markers", "shop(**config): how the `shop` fixture builds the shop (see make_shop)")


def pytest_runtest_logstart(nodeid, location):
    if _claimed and not os.environ.get("TEST_REDIS_URL"):
        from redis import Redis

        with Redis.from_url(LOCKS_URL) as locks:
            locks.expire(f"backstop-test-run-lock:{_claimed[0].rsplit('/', 1)[-1]}", LOCK_SECONDS)


def pytest_unconfigure(config):
    from redis import Redis

    if os.environ.get("TEST_REDIS_URL") or not _claimed:
        return
    index = _claimed[0].rsplit("/", 1)[-1]
    locks = Redis.from_url(LOCKS_URL)
    try:
        if locks.get(f"backstop-test-run-lock:{index}") == RUN_ID.encode():
            Redis.from_url(_claimed[0]).flushdb()
            locks.delete(f"backstop-test-run-lock:{index}")
    finally:
        locks.close()


def _make_database() -> tuple[str, callable]:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        server = make_url(url)
        name = f"backstop_test_{RUN_ID}"
        admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))

        def drop():
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()

        return server.set(database=name).render_as_string(hide_password=False), drop
    folder = tempfile.mkdtemp(prefix="backstop-test-")
    return f"sqlite:///{folder}/test.sqlite3", (lambda: None)


@pytest.fixture(scope="session")
def database_url():
    url, drop = _make_database()
    yield url
    drop()


@pytest.fixture(scope="session")
def is_postgres(database_url):
    return database_url.startswith("postgresql")


@pytest.fixture(scope="session")
def _schema(database_url):
    """Build the schema once per session through the committed migrations."""
    from flask_migrate import upgrade

    app = create_app(base_config(database_url))
    with app.app_context():
        upgrade()
        db.engine.dispose()
    return True


def _truncate(app):
    """Every table emptied, children first, and (PostgreSQL) every sequence back at 1, as
    `TRUNCATE ... RESTART IDENTITY` would: but DELETE on these small tables takes about 20 ms where
    TRUNCATE, which gives each table new files, took half a second, before every test."""
    with app.app_context():
        tables = [t.name for t in reversed(db.metadata.sorted_tables)]
        with db.engine.begin() as conn:
            for t in tables:
                conn.execute(text(f'DELETE FROM "{t}"'))
            if conn.dialect.name == "postgresql":
                conn.execute(
                    text(
                        "SELECT setval(c.oid::regclass, 1, false) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE c.relkind = 'S' AND n.nspname = current_schema()"
                    )
                )


@pytest.fixture
def redis_conn():
    """A connection to this run's Redis database, as it is (nothing flushed)."""
    from redis import Redis

    conn = Redis.from_url(redis_url())
    yield conn
    conn.close()


@pytest.fixture
def flushed_redis(redis_conn):
    """Wipes Redis: FLUSHDB of this run's Redis database (queues, scheduler, limiter counters),
    then yields the connection."""
    redis_conn.flushdb()
    return redis_conn


@pytest.fixture(scope="session")
def _wiper(database_url, _schema):
    """The app truncated_db empties the tables through, built once: building one before every
    test cost about 50 ms each, a minute and more of a run. Its engine is disposed after each use,
    so between tests it holds no connection."""
    return create_app(base_config(database_url))


@pytest.fixture
def truncated_db(database_url, _wiper):
    """Wipes the database: every table emptied (TRUNCATE ... RESTART IDENTITY on PostgreSQL,
    DELETE on SQLite; the schema stays), then yields its URL."""
    _truncate(_wiper)
    with _wiper.app_context():
        db.engine.dispose()
    return database_url


@pytest.fixture(autouse=True)
def _system_clock_after_each_test():
    """Whatever clock a test gave its apps (create_app's CLOCK), the next test starts on the system's."""
    yield
    shop_clock.use(None)


@pytest.fixture
def fake_clock():
    """A clock the test moves by hand (support.FakeClock), for the apps it builds:
    `make_shop(CLOCK=fake_clock)` (every app of the test, since each create_app sets the process's clock)."""
    return FakeClock()


@pytest.fixture
def make_fresh_app(flushed_redis, truncated_db):
    """Wipes both stores first (flushed_redis, truncated_db), then builds apps on them, each with
    extra config: `make_fresh_app(STRIPE_API_BASE=...)`."""
    apps = []

    def factory(**overrides):
        app = create_app(base_config(truncated_db, **overrides))
        apps.append(app)
        return app

    yield factory
    for app in apps:
        provider_guard = app.extensions.get("backstop", {}).get("provider_guard")
        if provider_guard is not None:
            provider_guard.close()  # its prober, if the breaker was left open, stops probing the sandbox
        with app.app_context():
            db.session.remove()
            held = db.engine.pool.checkedout()
            db.engine.dispose()
        # A connection still out when the test is over belongs to something that outlived it (a
        # thread, a session never removed): disposing leaves it to the garbage collector, which
        # reports psycopg's open connection during whichever later test it runs in.
        assert held == 0, f"{held} database connection(s) still checked out of the app's pool after the test"


@pytest.fixture
def fresh_app(make_fresh_app):
    """The app with the default test config, on an emptied database and a flushed Redis."""
    return make_fresh_app()


@pytest.fixture
def fresh_client(fresh_app):
    """A test client of fresh_app (so: emptied database, flushed Redis)."""
    return fresh_app.test_client()


@pytest.fixture
def fresh_ctx(fresh_app):
    """An app context of fresh_app (emptied database, flushed Redis), for calling use cases."""
    with fresh_app.app_context():
        yield fresh_app
        db.session.remove()


@pytest.fixture
def token(fresh_app, fresh_client):
    """An operator logged in on fresh_client: the session's CSRF token."""
    return log_in(fresh_app, fresh_client)


@pytest.fixture(scope="session")
def sandbox_server():
    from shop.stripe_sandbox.testing import running_sandbox

    with serving(lambda: running_sandbox(min_session_seconds=60)) as handle:
        yield handle


@pytest.fixture
def sandbox(sandbox_server):
    sandbox_server.reset()
    yield sandbox_server
    sandbox_server.reset()


def _paying_config(sandbox) -> dict:
    return dict(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60, STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET)


@pytest.fixture
def mail_folder(monkeypatch, tmp_path):
    """Apps built after this write their mail (no SMTP_URL) under this test's own instance folder;
    the folder it returns."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    return tmp_path / "instance" / "mail"


@pytest.fixture
def browser(shop):
    """A customer's browser (payment_helpers.Shopper) on `shop`: the one `browser` fixture (the
    real chromium of tests/browser/ is `chromium`, its pages `page` and `new_page`)."""
    return Shopper(shop)


@pytest.fixture
def order_id(fresh_ctx):
    """One order placed (a unit of the catalog's first variant) in fresh_ctx, its session removed:
    the order store's tests start from it."""
    skus = seed_catalog_rows()
    oid = place_order_for({next(iter(sorted(skus.values()))): 1}).order_id
    db.session.remove()
    return oid


@pytest.fixture
def fresh_paying_app(make_fresh_app, sandbox):
    """An app wired to the sandbox, with its webhook signing secret known, on an emptied database
    and a flushed Redis."""
    return make_fresh_app(**_paying_config(sandbox))


@pytest.fixture
def shopper(fresh_paying_app):
    """A customer's browser (payment_helpers.Shopper) on fresh_paying_app, with the demo catalog."""
    return Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))


@pytest.fixture
def make_shop(make_fresh_app, request):
    """Builds shops on emptied stores (make_fresh_app): each an app with the demo catalog (its sku
    -> variant id in app.skus) and `config` over the test config. Where its payments go:
    - by default the provider refuses connections at once (UNREACHABLE_PROVIDER), so a checkout
      leaves the order PendingPayment with "Pay now" until payment lands;
    - `make_shop(sandbox=True)`: the Stripe sandbox, its webhook secret known (as fresh_paying_app);
    - `make_shop(served=True)`: the sandbox, with the shop served over real HTTP on a free port
      (its PUBLIC_BASE_URL) and registered as the sandbox's webhook endpoint exactly as
      `flask shop stripe-register-webhook` does (payment_helpers.live_shop), until the test ends."""
    with contextlib.ExitStack() as serving:

        def build(*, sandbox: bool = False, served: bool = False, **config):
            if served:
                app = serving.enter_context(live_shop(make_fresh_app, request.getfixturevalue("sandbox"), **config))
            elif sandbox:
                app = make_fresh_app(**{**_paying_config(request.getfixturevalue("sandbox")), **config})
            else:
                app = make_fresh_app(**{"STRIPE_API_BASE": UNREACHABLE_PROVIDER, **config})
            app.skus = seed_catalog_rows(app)
            return app

        yield build


@pytest.fixture
def shop(make_shop, request):
    """The shop of make_shop (demo catalog in app.skus, provider unreachable), built as the test's
    or its module's `shop` marker says where that differs: `pytest.mark.shop(served=True)`,
    `pytest.mark.shop(STRIPE_WEBHOOK_SECRET=...)`."""
    marker = request.node.get_closest_marker("shop")
    return make_shop(**(marker.kwargs if marker else {}))


@pytest.fixture
def no_order_placed_email(monkeypatch):
    """The order-placed email (a delivery of every checkout's OrderPlaced) left out, for tests whose
    sample work is other deliveries and deadlines and that count them or Redis's queues: it would
    add one more of the same per order without adding a case (tests/saga/test_order_placed_email.py
    pins the email itself)."""
    from shop.outbox.subscriptions import SUBSCRIPTIONS

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", [])
