"""Shared fixtures. Real PostgreSQL (when DATABASE_URL names one) or SQLite, real Redis, and the
Stripe sandbox as a real HTTP server. Each pytest session gets its own database and its own
Redis key prefix, so runs never see each other's rows or jobs."""
from __future__ import annotations

import os
import re
import tempfile
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from shop import create_app
from shop.extensions import db

RUN_ID = uuid.uuid4().hex[:8]


LOCKS_URL = os.environ.get("TEST_REDIS_LOCKS_URL", "redis://127.0.0.1:6379/15")
TEST_DBS = range(1, 15)  # 0 is the shop's default, 15 holds the locks
# A run renews its lock as it goes (pytest_runtest_logstart), so a run that was killed frees its
# database within this long instead of holding it for hours.
LOCK_SECONDS = 900


def _claim_redis_db() -> str:
    """A Redis database of its own for this pytest run: tests flush it (Redis losing everything
    is a case we test), so two runs on one machine must never share one. Databases 1-14 are
    claimed with lock keys kept in database 15 (which no test flushes) that expire if a run
    dies; TEST_REDIS_URL overrides the choice. Claimed on first use, not at import: the pure
    domain's tests (tests/domain) run with no Redis and no database at all."""
    if os.environ.get("TEST_REDIS_URL"):
        return os.environ["TEST_REDIS_URL"]
    from redis import Redis

    locks = Redis.from_url(LOCKS_URL)
    try:
        for index in TEST_DBS:
            if locks.set(f"backstop-test-run-lock:{index}", RUN_ID, nx=True, ex=LOCK_SECONDS):
                return LOCKS_URL.rsplit("/", 1)[0] + f"/{index}"
    finally:
        locks.close()
    raise RuntimeError(f"every Redis test database {TEST_DBS[0]}-{TEST_DBS[-1]} is claimed by another test run")


_claimed: list[str] = []


def redis_url() -> str:
    if not _claimed:
        _claimed.append(_claim_redis_db())
    return _claimed[0]


def __getattr__(name: str):
    # `from conftest import REDIS_URL` keeps working, and claims the database only then.
    if name == "REDIS_URL":
        return redis_url()
    raise AttributeError(name)


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


def base_config(database_url: str, **overrides) -> dict:
    config = {
        "TESTING": True,
        "SECRET_KEY": "test-secret",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url(),
        "QUEUE_PREFIX": f"bt-{RUN_ID}",
        "PUBLIC_BASE_URL": "http://127.0.0.1:5000",
        "OUTBOX_RETRY_BASE_SECONDS": 0.05,
        "OUTBOX_RETRY_CAP_SECONDS": 0.2,
        "OUTBOX_PROVIDER_RETRY_BASE_SECONDS": 0.05,
        "OUTBOX_PROVIDER_RETRY_CAP_SECONDS": 0.2,
        "STRIPE_MAX_NETWORK_RETRIES": 0,
        "STRIPE_TIMEOUT_SECONDS": 5,
    }
    config.update(overrides)
    return config


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
    with app.app_context():
        tables = [t.name for t in reversed(db.metadata.sorted_tables)]
        with db.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"))
            else:
                for t in tables:
                    conn.execute(text(f'DELETE FROM "{t}"'))


@pytest.fixture
def redis_conn():
    from redis import Redis

    conn = Redis.from_url(redis_url())
    yield conn
    conn.close()


@pytest.fixture
def make_app(database_url, _schema, redis_conn):
    """Build an app with extra config; the database is emptied and Redis flushed first."""
    apps = []

    def factory(**overrides):
        app = create_app(base_config(database_url, **overrides))
        apps.append(app)
        return app

    redis_conn.flushdb()
    first = create_app(base_config(database_url))
    _truncate(first)
    with first.app_context():
        db.engine.dispose()
    yield factory
    for app in apps:
        with app.app_context():
            db.session.remove()
            db.engine.dispose()


@pytest.fixture
def app(make_app):
    return make_app()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def ctx(app):
    with app.app_context():
        yield app
        db.session.remove()


_CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def csrf_token(client, url: str = "/cart") -> str:
    """The token a browser would read from a rendered form."""
    page = client.get(url, headers={"Accept": "text/html"})
    match = _CSRF.search(page.get_data(as_text=True))
    assert match, f"no csrf_token in {url}"
    return match.group(1)


OPERATOR_EMAIL, OPERATOR_PASSWORD = "night-shift@example.com", "correct horse battery staple"


def add_operator(app) -> None:
    """As `flask shop create-operator` does, with a cheap hash so the tests stay fast (any
    werkzeug method verifies the same way); one test goes through upsert_operator itself."""
    from werkzeug.security import generate_password_hash

    from shop.models import Operator

    with app.app_context():
        db.session.add(Operator(email=OPERATOR_EMAIL,
                                password_hash=generate_password_hash(OPERATOR_PASSWORD, "pbkdf2:sha256:1000")))
        db.session.commit()


def log_in(app, client) -> str:
    """Create the operator, log in through the form; returns the session's CSRF token."""
    add_operator(app)
    token = csrf_token(client, "/console/login")
    r = client.post("/console/login", data={"csrf_token": token, "email": OPERATOR_EMAIL,
                                            "password": OPERATOR_PASSWORD})
    assert r.status_code == 303, r.get_data(as_text=True)
    return token


@pytest.fixture(scope="session")
def sandbox_server():
    from shop.stripe_sandbox.testing import running_sandbox

    with running_sandbox(min_session_seconds=60) as handle:
        yield handle


@pytest.fixture
def sandbox(sandbox_server):
    sandbox_server.reset()
    yield sandbox_server
    sandbox_server.reset()


@pytest.fixture
def paying_app(make_app, sandbox):
    """An app wired to the sandbox, with its webhook signing secret known."""
    app = make_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60,
                   STRIPE_WEBHOOK_SECRET="whsec_test_secret")
    return app


def leave_heartbeats(app) -> None:
    """The heartbeats a running worker and scheduler leave, written by the same code their
    processes run (a real RQ worker registration, the scheduler's own beat), without running
    them: for tests of /healthz and the dashboard that are not about liveness."""
    from shop import queue

    with app.app_context():
        worker = queue.make_worker(name=f"test-worker-{uuid.uuid4().hex[:8]}")
        worker.register_birth()
        worker.heartbeat()
        queue.make_scheduler().heartbeat()
