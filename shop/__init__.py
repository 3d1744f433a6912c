"""Backstop: a storefront whose checkout stays correct across a database and Stripe."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

from flask import Flask

from . import clock, connections, logs, node
from .connections import engine_options as _engine_options
from .connections import pooler_client_limit as _pooler_client_limit
from .connections import server_limit as _server_limit
from .connections import web_connections
from .settings import Settings, SettingsError, instance_path, load_settings, make_private_folder

__all__ = ["create_app", "SettingsError", "web_connections"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def create_app(test_config: dict | None = None, env: Mapping[str, str] | None = None) -> Flask:
    """Build the app. Settings are read and validated here, never at import time."""
    env = os.environ if env is None else env
    # The process's clock (shop.clock): the system's, or one a test moves by hand (test_config's CLOCK).
    test_config = dict(test_config) if test_config else None
    clock.use(test_config.pop("CLOCK", None) if test_config else None)
    app = Flask(
        __name__,
        template_folder=os.path.join(ROOT, "templates"),
        static_folder=os.path.join(ROOT, "static"),
        instance_path=instance_path(env, ROOT),
    )
    make_private_folder(app.instance_path)  # the SQLite file, mail, the demo's key: owner only
    settings = _settings(env, app.instance_path, test_config)
    app.config.update(settings.as_config(), SETTINGS=settings, **_flask_config(settings))
    if test_config:
        app.config.update(test_config)
    node.init_app(app)
    _configure_logging(settings.log_format)
    if settings.sentry_dsn:
        # Imported only here: without SENTRY_DSN nothing of sentry-sdk is loaded (an optional extra).
        from .reporting import init_error_reporting

        init_error_reporting(app)
    _init_tracing(app, env)
    from .redis_client import warn_when_redis_is_unprotected

    warn_when_redis_is_unprotected(app.config["REDIS_URL"])

    # The app's parts are imported here, not at the top: this file runs first on ANY import of a
    # shop module, and the domain's tests, the sandbox (`python -m shop.stripe_sandbox`) and the
    # settings check must not load (or depend on) the whole app. This is the composition root:
    # the one place that wires every layer together.
    from . import errors, provider, web
    from .extensions import db
    from .outbox import dispatch

    _init_database(app)
    _init_auth(app)
    errors.init_app(app)
    errors.init_teardown(app, db)
    web.init_app(app)
    # The provider answering again makes the rows that backed off for it due: the outbox's wake-up,
    # handed in as the outbox's handlers are, so the provider imports none of the layers above it.
    provider.init_app(app, wake_waiting_work=dispatch.wake_provider_waiters)
    _register_work(app)
    _register_areas(app)
    return app


def _init_tracing(app, env: Mapping[str, str]) -> None:
    """Spans, when the OTEL_* variables ask for them and the `otel` extra is installed (shop.tracing,
    imported only then: otherwise the shop imports nothing of OpenTelemetry and nothing changes)."""
    from . import traces

    if not traces.wanted(env):
        return
    try:
        if not traces.installed():
            raise ImportError("opentelemetry-sdk is not installed")
        from .tracing import init_tracing
    except ImportError as exc:
        logging.getLogger("shop").warning(
            "OTEL_* variables ask for traces but the otel extra cannot be loaded (%s): no spans "
            "(pip install 'backstop[otel]')",
            exc,
        )
        return
    init_tracing(app, env)


def _settings(env, instance: str, test_config: dict | None) -> Settings:
    if test_config and test_config.get("SECRET_KEY"):
        # A key given by the caller (tests, bench scripts) counts as the environment's.
        env = {**env, "SECRET_KEY": test_config["SECRET_KEY"]}
    settings = load_settings(env, instance)
    overrides = {k.lower(): v for k, v in (test_config or {}).items() if k.lower() in Settings.__dataclass_fields__}
    return Settings(**{**settings.__dict__, **overrides}) if overrides else settings


def _flask_config(settings: Settings) -> dict:
    https = settings.public_base_url.startswith("https://")
    return dict(
        SQLALCHEMY_DATABASE_URI=settings.database_url,
        SQLALCHEMY_ENGINE_OPTIONS=_engine_options(settings),
        MAX_CONTENT_LENGTH=1_000_000,
        WTF_CSRF_TIME_LIMIT=None,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        # Behind https, cookies (the browser's orders and the operator's login) never travel in clear.
        SESSION_COOKIE_SECURE=https,
        REMEMBER_COOKIE_SECURE=https,
        # Internal tunables, not part of the public contract.
        OUTBOX_RETRY_BASE_SECONDS=2.0,
        OUTBOX_RETRY_CAP_SECONDS=300.0,
        # Work waiting for an unavailable provider retries for as long as it takes, at most this
        # far apart (domain.deadlines.retry_decision).
        OUTBOX_PROVIDER_RETRY_BASE_SECONDS=2.0,
        OUTBOX_PROVIDER_RETRY_CAP_SECONDS=300.0,
        RELAY_INTERVAL_SECONDS=5,
        RELAY_GRACE_SECONDS=10,
        RELAY_BATCH_SIZE=500,
        # The prune (scheduling.retention): rows per batch, each batch its own short transaction,
        # a pause between batches so the database serves others first, and how long one run of
        # the periodic job may hold its worker before it hands over and queues its continuation.
        # bench/retention.py on a 10-million-row backlog, checkout at half its capacity: 100 rows a
        # batch at 1,000 rows/s cost checkout's p99 1.06x; 500 at 3,000 measured 1.13x, 200 at
        # 2,000 1.42x (the machine's noise is of that size). The slowest of the three, for the
        # margin: a steady shop leaves a few rows a second to prune, a backlog takes hours.
        PRUNE_BATCH_SIZE=100,
        PRUNE_PAUSE_SECONDS=0.05,
        PRUNE_ROWS_PER_SECOND=1000,
        PRUNE_JOB_SECONDS=20.0,
        STRIPE_TIMEOUT_SECONDS=10,
        STRIPE_MAX_NETWORK_RETRIES=2,
        # A customer's request (provider.guard): short timeouts, one retry, and an overall budget
        # so the page answers within about 10 s however the provider behaves.
        STRIPE_REQUEST_CONNECT_TIMEOUT_SECONDS=2.0,
        STRIPE_REQUEST_READ_TIMEOUT_SECONDS=4.0,
        STRIPE_REQUEST_MAX_NETWORK_RETRIES=1,
        STRIPE_REQUEST_BUDGET_SECONDS=9.0,
        STRIPE_CUSTOMER_WAIT_SECONDS=0.2,  # for a bulkhead slot or a budget token, then "Pay now"
        STRIPE_BACKGROUND_WAIT_SECONDS=2.0,  # then the background work is retried later
        STRIPE_BREAKER_PROBE_SECONDS=15.0,  # a half-open probe not heard from by then is replaced
    )


def _configure_logging(log_format: str) -> None:
    # Every line names the node it comes from (BACKSTOP_NODE_NAME): with several nodes' logs in
    # one place, a line without it cannot be traced to a machine. LOG_FORMAT: text for people,
    # or one JSON object per line with the request, job, work and order it belongs to (shop.logs).
    node.add_node_to_log_records()
    logs.configure(log_format)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.getLogger("stripe").setLevel(logging.WARNING)  # one INFO line per API request otherwise


def _init_database(app) -> None:
    from . import models  # noqa: F401  (register tables)
    from .extensions import db, migrate

    db.init_app(app)
    migrate.init_app(app, db, directory=os.path.join(ROOT, "migrations"), render_as_batch=True)
    connections.configure_sqlite(app)
    _configure_idle_ping(app)


def _init_auth(app) -> None:
    from .extensions import csrf, login_manager

    csrf.init_app(app)
    login_manager.init_app(app)  # its user loader is the console's (shop/console/sessions.py)


def _register_work(app) -> None:
    """The use cases' handlers and scheduled commands, handed to the outbox that runs them (the
    outbox sits below the use cases and imports none of them)."""
    from .outbox import dispatch
    from .saga import HANDLERS
    from .scheduling.commands import COMMANDS

    dispatch.init_app(app, handlers=HANDLERS, commands=COMMANDS)


def _register_areas(app) -> None:
    from . import cli, console, storefront, webhooks
    from .ops import bp as ops_bp

    storefront.init_app(app)
    app.register_blueprint(ops_bp)
    webhooks.init_app(app)
    console.init_app(app)
    cli.init_app(app, app_factory=create_app)


# A pooled connection used this recently is alive (PostgreSQL restarts and idle timeouts act
# on connections that sat unused); one idle longer is pinged before it is handed out.
IDLE_PING_SECONDS = 5.0


def _configure_idle_ping(app) -> None:
    """Pessimistic disconnect handling at the price of a round trip per idle connection, not
    per transaction: SQLAlchemy's `pool_pre_ping` pings on every checkout, and a worker's drain
    or a checkout request checks a connection out once per transaction. A failed ping raises
    DisconnectionError, on which the pool discards that connection and hands out another."""
    from sqlalchemy import event, exc

    from .extensions import db

    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        return
    with app.app_context():
        engine = db.engine
    _warn_when_the_web_may_outgrow_the_server(app, engine)

    # A connection just opened, or just handed back, needs no ping on its next checkout.
    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _mark_alive(_dbapi_conn, record):
        if record is not None:
            record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, record, _proxy):
        last = record.info.get("checked_in_at")
        if last is not None and time.monotonic() - last < IDLE_PING_SECONDS:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as error:
            raise exc.DisconnectionError(f"pooled connection failed its ping: {error}") from error
        if not alive:
            raise exc.DisconnectionError("pooled connection failed its ping")


def _warn_when_the_web_may_outgrow_the_server(app, engine) -> None:
    """On the first connection a process opens, compare what the web may open with what the
    server in front of it allows (PostgreSQL's max_connections, or PgBouncer's max_client_conn),
    and say so in the log when it does not fit: otherwise the first burst that needs them answers
    503 ("too many clients") with nothing in the log before it. Costs one statement per process;
    never stops the process."""
    from sqlalchemy import event

    settings = app.config["SETTINGS"]
    pool = _engine_options(settings)
    wanted = web_connections(settings)

    @event.listens_for(engine, "first_connect")
    def _check(dbapi_conn, _record):
        if settings.database_pooler == "pgbouncer":
            allowed, what = _pooler_client_limit(settings.database_url), "PgBouncer allows %d clients (max_client_conn)"
            remedy = "raise max_client_conn"
        else:
            allowed, what = _server_limit(dbapi_conn), "PostgreSQL allows %d connections (max_connections)"
            remedy = "raise max_connections, or put PgBouncer in front"
        if allowed is None or wanted < allowed:
            return
        logging.getLogger("shop").warning(
            what + " and the web alone may open %d "
            "(WEB_CONCURRENCY %d x a pool of %d + %d for WEB_THREADS %d), besides the worker and the "
            "scheduler: during a burst, requests that find no connection will answer 503. Lower "
            "WEB_THREADS or WEB_CONCURRENCY, %s (README, Sizing the web).",
            allowed,
            wanted,
            settings.web_concurrency,
            pool["pool_size"],
            pool["max_overflow"],
            settings.web_threads,
            remedy,
        )
