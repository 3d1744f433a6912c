"""Settings: read from the environment once, when the app is created, and validated.

A bad value stops the process with one line naming the variable (docs/REFERENCE.md, Settings): a shop
that starts half-configured loses orders quietly, which is worse than not starting.
"""

from __future__ import annotations

import os
import secrets
import ssl
import sys
from typing import NamedTuple
from dataclasses import dataclass, asdict

from urllib.parse import urlsplit

from .logs import FORMATS as LOG_FORMATS, TEXT as LOG_FORMAT_TEXT
from .node import MAX_LENGTH as NODE_NAME_MAX_LENGTH, host_node_name

# The largest quantity the cart's forms take for one line (orders.cart uses the same bound).
MOST_OF_ONE_ITEM = 99


class SettingsError(Exception):
    """A configuration value is missing or wrong. The message names the variable."""

    def __init__(self, variable: str, problem: str):
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


# UNPAID_HOLD_WITHOUT_SESSION_SECONDS unless set (or the window, when that is shorter): long enough
# for a provider blip to pass (the breaker's probe reopens payments within seconds, and Stripe's
# incidents are mostly minutes) and for the customer to come back to "Pay now"; short enough that
# checkouts piling up without a payment page during an outage hold their stock for a third of the
# default window, not all of it (docs/REFERENCE.md, Settings).
DEFAULT_HOLD_WITHOUT_SESSION_SECONDS = 600
DEFAULT_WEB_CONCURRENCY = 2
# Where the shop ships physical goods unless SHIPPING_COUNTRIES says otherwise: the countries the
# payment page lets a customer choose for the shipping address (Stripe's `allowed_countries`).
DEFAULT_SHIPPING_COUNTRIES = (
    "US", "CA", "GB", "IE", "FR", "DE", "NL", "BE", "AT", "ES", "IT", "PT", "SE", "DK", "FI", "NO", "CH", "AU", "NZ",
)  # fmt: skip
DEFAULT_WEB_THREADS = 32


def default_max_concurrent_calls(web_threads: int) -> int:
    """STRIPE_MAX_CONCURRENT_CALLS unless set: 5/8 of the threads (docs/REFERENCE.md, Settings)."""
    return max(1, web_threads * 5 // 8)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Settings:
    database_url: str
    redis_url: str
    # What stands between the shop and PostgreSQL: "none", or "pgbouncer" (transaction pooling).
    database_pooler: str
    secret_key: str
    secret_key_ephemeral: bool
    public_base_url: str
    stripe_secret_key: str | None
    stripe_webhook_secret: str | None
    stripe_api_base: str | None
    unpaid_order_expiry_seconds: int
    stripe_session_min_seconds: int
    reconciliation_interval_seconds: int
    reconciliation_stuck_age_seconds: int
    reconciliation_batch_size: int
    reconciliation_enabled: bool
    unpaid_order_expiry_enabled: bool
    outbox_max_attempts: int
    scheduler_poll_seconds: int
    health_stale_seconds: int
    smtp_url: str | None
    # The console's door (docs/REFERENCE.md, Settings): failed logins before a 429, and idleness.
    login_max_failures_per_account: int
    login_max_failures_per_address: int
    login_failure_window_seconds: int
    console_idle_timeout_seconds: int
    # The return page's throttle (docs/REFERENCE.md, Settings): requests per client address a minute.
    checkout_return_per_minute: int
    # Process environment (docs/REFERENCE.md, Settings): for running shops or test runs side by side.
    queue_prefix: str
    outbox_lease_seconds: int
    # BACKSTOP_NODE_NAME: the node this process belongs to (shop.node), default the host name.
    node_name: str = ""
    reconciliation_lease_seconds: int = 20
    web_concurrency: int = 2
    web_threads: int = 32
    stripe_max_concurrent_calls: int = 16
    stripe_rate_limit_per_second: int = 80
    stripe_endpoint_rate_limit_per_second: int = 20
    stripe_breaker_threshold: int = 5
    stripe_breaker_cooldown_seconds: int = 30
    # Hoarding limits (docs/REFERENCE.md, Settings): live unpaid orders one browser or one email
    # may hold at once, and units of one item per cart line; beyond them checkout refuses.
    unpaid_orders_per_client: int = 3
    max_line_quantity: int = 10
    # METRICS_TOKEN: when set, /metrics answers only with `Authorization: Bearer <it>`.
    metrics_token: str | None = None
    # SMTP_CA_FILE: a PEM bundle trusted instead of the system's CAs when the mailer checks the
    # mail server's certificate (smtp+starttls://, smtps://).
    smtp_ca_file: str | None = None
    # WEB_FRONT: what `flask shop web` puts before gunicorn ("nginx", or "none" to run it bare).
    web_front: str = "nginx"
    # BACKSTOP_BEHIND_FRONT: set by `flask shop web` and `flask shop up` for the gunicorn behind
    # their nginx: a request from a loopback peer carries the client's address in X-Forwarded-For.
    behind_front: bool = False
    # UNPAID_HOLD_WITHOUT_SESSION_SECONDS: how long an order that never had a payment session
    # holds its stock (at most the payment window; domain.deadlines.unpaid_hold_seconds).
    unpaid_hold_without_session_seconds: int = DEFAULT_HOLD_WITHOUT_SESSION_SECONDS
    # LOG_FORMAT: "text" (one line for people, the default) or "json" (one object per line; shop.logs).
    log_format: str = LOG_FORMAT_TEXT
    # SENTRY_DSN: when set, errors of the web and the workers go to Sentry (shop.reporting).
    sentry_dsn: str | None = None
    # Retention (docs/REFERENCE.md, Settings): finished work, receipts and sweep cycles are pruned
    # after RETENTION_DAYS, operator actions after AUDIT_RETENTION_DAYS, by a periodic job that
    # runs every PRUNE_INTERVAL_SECONDS (shop.scheduling.retention).
    retention_days: int = 30
    audit_retention_days: int = 400
    prune_interval_seconds: int = 3600
    # SHIPPING_COUNTRIES: the countries a shipping address may be in (two-letter ISO codes).
    shipping_countries: tuple[str, ...] = DEFAULT_SHIPPING_COUNTRIES

    @property
    def uses_sandbox(self) -> bool:
        return not self.stripe_secret_key

    def as_config(self) -> dict:
        return {k.upper(): v for k, v in asdict(self).items()}


def _countries(env, name, default):
    """A comma-separated list of two-letter ISO country codes (`US,CA,GB`), as Stripe takes them."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    codes = tuple(dict.fromkeys(part.strip().upper() for part in raw.split(",") if part.strip()))
    wrong = [code for code in codes if len(code) != 2 or not code.isascii() or not code.isalpha()]
    if not codes or wrong:
        got = ", ".join(wrong) if wrong else repr(raw)
        raise SettingsError(name, f"must be two-letter country codes separated by commas (US,CA,GB), got {got}")
    return codes


def _int(env, name, default, lo, hi):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(name, f"must be a whole number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise SettingsError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _bool(env, name, default):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(name, f"must be true or false, got {raw!r}")


class SentinelURL(NamedTuple):
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    password: str | None


def parse_sentinel_url(url: str) -> SentinelURL:
    """`redis+sentinel://[[user]:password@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]` (the form
    Flask-Limiter's storage reads too), or ValueError saying what is wrong with it."""
    rest = url.removeprefix("redis+sentinel://")
    auth, _, rest = rest.rpartition("@")
    where, _, path = rest.partition("/")
    parts = [p for p in path.split("/") if p]
    if not where or not parts or len(parts) > 2:
        raise ValueError("expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
    sentinels = []
    for endpoint in where.split(","):
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a Sentinel is HOST:PORT, got {endpoint!r}")
        sentinels.append((host, int(port)))
    if len(parts) == 2 and not parts[1].isdigit():
        raise ValueError(f"the database after the service is a number, got {parts[1]!r}")
    user, _, password = auth.partition(":") if auth else ("", "", "")
    return SentinelURL(sentinels, parts[0], int(parts[1]) if len(parts) == 2 else 0, user or None, password or None)


def _redis_url(env) -> str:
    url = _url(env, "REDIS_URL", "redis://127.0.0.1:6379/0", ["redis://", "rediss://", "unix://", "redis+sentinel://"])
    if url.startswith("redis+sentinel://"):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise SettingsError("REDIS_URL", f"{exc}, got {url!r}") from None
    return url


def _url(env, name, default, schemes):
    value = (env.get(name) or "").strip() or default
    if value is None:
        return None
    if not any(value.startswith(s) for s in schemes):
        raise SettingsError(name, f"must start with one of {', '.join(schemes)}, got {value!r}")
    return value.rstrip("/") if schemes[0].startswith("http") else value


def _may_run_without_secret_key(argv=None) -> bool:
    """True only for a Flask CLI command other than `flask run` (db upgrade, shop worker, shop
    up, which makes a key per run and hands it to its children, ...): nothing there serves pages.

    Everywhere else SECRET_KEY is required: gunicorn, `flask run`, and any other host that imports
    app.py (uwsgi, mod_wsgi, waitress, a REPL), since each process inventing its own key would
    break sessions and CSRF tokens between workers without a word."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return False
    flask_cli = os.path.basename(argv[0]) == "flask" or argv[0].endswith(os.path.join("flask", "__main__.py"))
    return flask_cli and "run" not in argv[1:]


def instance_path(env, root: str) -> str:
    """The instance folder (default SQLite file, mail, the demo's key): BACKSTOP_INSTANCE_PATH or
    `instance/` next to app.py. Read before the other settings, whose defaults live in it."""
    return (env.get("BACKSTOP_INSTANCE_PATH") or "").strip() or os.path.join(root, "instance")


def make_private_folder(path: str) -> None:
    """Create `path` (and any missing parents) readable by its owner only, 0700: the instance
    folder holds the SQLite file (password hashes, the webhook signing secret), the demo's key and
    the order emails. A folder that exists already is left as it is."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def _database_url(env, instance_path: str) -> str:
    default_db = "sqlite:///" + os.path.join(os.path.abspath(instance_path), "backstop.sqlite3")
    database_url = _url(env, "DATABASE_URL", default_db, ["sqlite", "postgresql"])
    if database_url.startswith("postgresql://") or database_url.startswith("postgres://"):
        # psycopg 3 is the driver we ship and test; plain postgresql:// would pick psycopg2.
        database_url = "postgresql+psycopg://" + database_url.split("://", 1)[1]
    return database_url


def _secret_key(env, argv) -> tuple[str, bool]:
    """(the key, whether it was made up for this process only)."""
    secret_key = (env.get("SECRET_KEY") or "").strip()
    if secret_key:
        return secret_key, False
    if not _may_run_without_secret_key(argv):
        raise SettingsError("SECRET_KEY", "is required to serve the web app (every web process must share it)")
    return secrets.token_urlsafe(32), True


def _payment_window(env) -> tuple[int, int, int]:
    """(UNPAID_ORDER_EXPIRY_SECONDS, RECONCILIATION_STUCK_AGE_SECONDS,
    UNPAID_HOLD_WITHOUT_SESSION_SECONDS)."""
    expiry = _int(env, "UNPAID_ORDER_EXPIRY_SECONDS", 1800, 1, 7 * 24 * 3600)
    stuck = _int(env, "RECONCILIATION_STUCK_AGE_SECONDS", 1800, 1, 7 * 24 * 3600)
    if stuck != expiry:
        raise SettingsError(
            "RECONCILIATION_STUCK_AGE_SECONDS",
            f"must equal UNPAID_ORDER_EXPIRY_SECONDS ({expiry}), got {stuck}: the sweep and the "
            "per-order deadline must agree on one payment window",
        )
    hold = _int(
        env, "UNPAID_HOLD_WITHOUT_SESSION_SECONDS", min(DEFAULT_HOLD_WITHOUT_SESSION_SECONDS, expiry), 1, 7 * 24 * 3600
    )
    if hold > expiry:
        raise SettingsError(
            "UNPAID_HOLD_WITHOUT_SESSION_SECONDS",
            f"must not be longer than UNPAID_ORDER_EXPIRY_SECONDS ({expiry}), got {hold}: an order "
            "without a payment page would be held longer than one with it",
        )
    return expiry, stuck, hold


def _web_threads(env) -> tuple[int, int]:
    """(WEB_THREADS, STRIPE_MAX_CONCURRENT_CALLS). Web concurrency (docs/REFERENCE.md, Settings;
    measured by bench/provider.py): threads hide the provider's latency. The bulkhead lets 5/8 of
    them call it (20 of 32: two processes hold 32 clients' calls even when one process accepted
    20 of them), at most 1/8 more wait briefly for a slot (payments.guard), and at least a quarter
    always serve everything else."""
    web_threads = _int(env, "WEB_THREADS", DEFAULT_WEB_THREADS, 1, 256)
    most_calls = max(1, web_threads - 1)
    max_calls = _int(env, "STRIPE_MAX_CONCURRENT_CALLS", default_max_concurrent_calls(web_threads), 1, 256)
    if max_calls > most_calls:
        raise SettingsError(
            "STRIPE_MAX_CONCURRENT_CALLS",
            f"must be between 1 and {most_calls} (WEB_THREADS - 1, so a thread is always "
            f"free for pages that do not wait on the provider), got {max_calls}",
        )
    return web_threads, max_calls


def _liveness(env) -> tuple[int, int]:
    """(SCHEDULER_POLL_SECONDS, HEALTH_STALE_SECONDS)."""
    poll = _int(env, "SCHEDULER_POLL_SECONDS", 1, 1, 3600)
    stale = _int(env, "HEALTH_STALE_SECONDS", 60, 2, 24 * 3600)
    if stale <= poll:
        raise SettingsError(
            "HEALTH_STALE_SECONDS",
            f"must be greater than SCHEDULER_POLL_SECONDS ({poll}), got {stale}: the scheduler beats once "
            "per poll, so a healthy one would look stalled between polls",
        )
    return poll, stale


def _node_name(env) -> str:
    """BACKSTOP_NODE_NAME: the first part of every identity this process leaves in PostgreSQL and
    Redis (`node:pid:...`), a log field and a metrics label, hence no ':' and no spaces."""
    raw = (env.get("BACKSTOP_NODE_NAME") or "").strip()
    if not raw:
        return host_node_name()
    if len(raw) > NODE_NAME_MAX_LENGTH:
        raise SettingsError("BACKSTOP_NODE_NAME", f"must be at most {NODE_NAME_MAX_LENGTH} characters, got {len(raw)}")
    if ":" in raw:
        raise SettingsError("BACKSTOP_NODE_NAME", f"must not contain ':' (identities are node:pid:...), got {raw!r}")
    if not raw.isprintable() or any(c.isspace() for c in raw):
        raise SettingsError("BACKSTOP_NODE_NAME", f"must be printable, without spaces, got {raw!r}")
    return raw


METRICS_TOKEN_MIN_LENGTH = 16


def _metrics_token(env) -> str | None:
    """METRICS_TOKEN: unset (or blank) leaves /metrics open. Set, it must be long enough not to be
    guessed and fit in an Authorization header as sent. The message never repeats the value: it
    is a secret, and the line goes to the log."""
    raw = (env.get("METRICS_TOKEN") or "").strip()
    if not raw:
        return None
    if len(raw) < METRICS_TOKEN_MIN_LENGTH:
        raise SettingsError("METRICS_TOKEN", f"must be at least {METRICS_TOKEN_MIN_LENGTH} characters, got {len(raw)}")
    if not all("!" <= c <= "~" for c in raw):
        raise SettingsError(
            "METRICS_TOKEN", "must be printable ASCII without spaces (a scraper sends it in an Authorization header)"
        )
    return raw


SMTP_SCHEMES = ["smtp://", "smtp+starttls://", "smtps://"]


def _smtp_url(env) -> str | None:
    """SMTP_URL: unset writes mail to files. The message names the scheme only: the URL may
    carry the mail server's password, and the line goes to the log."""
    raw = (env.get("SMTP_URL") or "").strip()
    if not raw:
        return None
    if not any(raw.startswith(s) for s in SMTP_SCHEMES):
        scheme = raw.split("://", 1)[0] + "://" if "://" in raw else "no scheme"
        raise SettingsError("SMTP_URL", f"must start with one of {', '.join(SMTP_SCHEMES)}, got {scheme}")
    return raw


def _smtp_ca_file(env) -> str | None:
    """SMTP_CA_FILE: a PEM bundle the mailer trusts for the mail server's certificate. Checked
    here, so a wrong path stops the start instead of every email failing later, one by one."""
    raw = (env.get("SMTP_CA_FILE") or "").strip()
    if not raw:
        return None
    if not os.path.isfile(raw):
        raise SettingsError("SMTP_CA_FILE", f"no such file: {raw!r}")
    if not os.access(raw, os.R_OK):
        raise SettingsError("SMTP_CA_FILE", f"cannot be read by this process: {raw!r}")
    try:
        ssl.create_default_context(cafile=raw)
    except (ssl.SSLError, ValueError, OSError) as exc:
        raise SettingsError("SMTP_CA_FILE", f"is not a PEM certificate bundle ({exc}): {raw!r}") from None
    return os.path.abspath(raw)


POOLERS = ("none", "pgbouncer")
WEB_FRONTS = ("nginx", "none")


def _web_front(env) -> str:
    raw = (env.get("WEB_FRONT") or "").strip().lower() or "nginx"
    if raw not in WEB_FRONTS:
        raise SettingsError("WEB_FRONT", f"must be one of {', '.join(WEB_FRONTS)}, got {raw!r}")
    return raw


def _log_format(env) -> str:
    raw = (env.get("LOG_FORMAT") or "").strip().lower() or LOG_FORMAT_TEXT
    if raw not in LOG_FORMATS:
        raise SettingsError("LOG_FORMAT", f"must be one of {', '.join(LOG_FORMATS)}, got {raw!r}")
    return raw


def _sentry_dsn(env) -> str | None:
    """SENTRY_DSN: unset reports nothing. A DSN is `http(s)://KEY@HOST[:PORT]/PROJECT`; the
    message names what is wrong without repeating the value (its key goes to the log otherwise)."""
    raw = (env.get("SENTRY_DSN") or "").strip()
    if not raw:
        return None
    try:
        parts = urlsplit(raw)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise SettingsError("SENTRY_DSN", f"is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        scheme = f"{parts.scheme}://" if parts.scheme else "no scheme"
        raise SettingsError("SENTRY_DSN", f"must start with one of http://, https://, got {scheme}")
    if not parts.username or not parts.hostname:
        raise SettingsError("SENTRY_DSN", "must name a key and a host: http(s)://KEY@HOST/PROJECT")
    if not parts.path.strip("/"):
        raise SettingsError("SENTRY_DSN", "must end with the project: http(s)://KEY@HOST/PROJECT")
    return raw


def _pooler(env, database_url: str) -> str:
    raw = (env.get("DATABASE_POOLER") or "").strip().lower() or "none"
    if raw not in POOLERS:
        raise SettingsError("DATABASE_POOLER", f"must be one of {', '.join(POOLERS)}, got {raw!r}")
    if raw != "none" and not database_url.startswith("postgresql"):
        raise SettingsError("DATABASE_POOLER", f"{raw} stands in front of PostgreSQL; DATABASE_URL is not PostgreSQL")
    return raw


def load_settings(env=None, instance_path: str = "instance", argv=None) -> Settings:
    """Every setting read from `env` and checked, in the order a bad value is reported."""
    env = os.environ if env is None else env
    database_url = _database_url(env, instance_path)
    secret_key, ephemeral = _secret_key(env, argv)
    expiry, stuck, hold = _payment_window(env)
    web_threads, max_calls = _web_threads(env)
    poll, stale = _liveness(env)

    return Settings(
        web_concurrency=_int(env, "WEB_CONCURRENCY", DEFAULT_WEB_CONCURRENCY, 1, 64),
        web_threads=web_threads,
        stripe_max_concurrent_calls=max_calls,
        # Stripe allows 100/s in live mode: stay below it with room for the dashboard and other tools.
        stripe_rate_limit_per_second=_int(env, "STRIPE_RATE_LIMIT_PER_SECOND", 80, 2, 10_000),
        # Stripe also limits each endpoint (method + path template) to 25/s by default.
        stripe_endpoint_rate_limit_per_second=_int(env, "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND", 20, 1, 10_000),
        stripe_breaker_threshold=_int(env, "BACKSTOP_STRIPE_BREAKER_THRESHOLD", 5, 1, 1_000_000),
        stripe_breaker_cooldown_seconds=_int(env, "BACKSTOP_STRIPE_BREAKER_COOLDOWN_SECONDS", 30, 1, 3600),
        database_url=database_url,
        database_pooler=_pooler(env, database_url),
        redis_url=_redis_url(env),
        secret_key=secret_key,
        secret_key_ephemeral=ephemeral,
        public_base_url=_url(env, "PUBLIC_BASE_URL", "http://127.0.0.1:5000", ["http://", "https://"]),
        stripe_secret_key=(env.get("STRIPE_SECRET_KEY") or "").strip() or None,
        stripe_webhook_secret=(env.get("STRIPE_WEBHOOK_SECRET") or "").strip() or None,
        stripe_api_base=_url(env, "STRIPE_API_BASE", None, ["http://", "https://"]),
        unpaid_order_expiry_seconds=expiry,
        unpaid_hold_without_session_seconds=hold,
        stripe_session_min_seconds=_int(env, "STRIPE_SESSION_MIN_SECONDS", 1800, 0, 24 * 3600),
        reconciliation_interval_seconds=_int(env, "RECONCILIATION_INTERVAL_SECONDS", 600, 1, 24 * 3600),
        reconciliation_stuck_age_seconds=stuck,
        reconciliation_batch_size=_int(env, "RECONCILIATION_BATCH_SIZE", 50, 1, 1000),
        reconciliation_enabled=_bool(env, "RECONCILIATION_ENABLED", True),
        unpaid_order_expiry_enabled=_bool(env, "UNPAID_ORDER_EXPIRY_ENABLED", True),
        outbox_max_attempts=_int(env, "OUTBOX_MAX_ATTEMPTS", 5, 1, 100),
        scheduler_poll_seconds=poll,
        health_stale_seconds=stale,
        unpaid_orders_per_client=_int(env, "UNPAID_ORDERS_PER_CLIENT", 3, 1, 1000),
        # At most the form's own bound (orders.cart.MOST_OF_ONE_ITEM): a larger limit would never bind.
        max_line_quantity=_int(env, "MAX_LINE_QUANTITY", 10, 1, MOST_OF_ONE_ITEM),
        # An unknown scheme (a typo of smtps://) would otherwise send in clear text.
        smtp_url=_smtp_url(env),
        smtp_ca_file=_smtp_ca_file(env),
        login_max_failures_per_account=_int(env, "LOGIN_MAX_FAILURES_PER_ACCOUNT", 5, 1, 1000),
        login_max_failures_per_address=_int(env, "LOGIN_MAX_FAILURES_PER_ADDRESS", 20, 1, 100_000),
        login_failure_window_seconds=_int(env, "LOGIN_FAILURE_WINDOW_SECONDS", 900, 1, 24 * 3600),
        console_idle_timeout_seconds=_int(env, "CONSOLE_IDLE_TIMEOUT_SECONDS", 1800, 60, 7 * 24 * 3600),
        checkout_return_per_minute=_int(env, "CHECKOUT_RETURN_PER_MINUTE", 30, 1, 100_000),
        queue_prefix=(env.get("BACKSTOP_QUEUE_PREFIX") or "").strip() or "backstop",
        node_name=_node_name(env),
        outbox_lease_seconds=_int(env, "BACKSTOP_OUTBOX_LEASE_SECONDS", 25, 1, 3600),
        # Short and renewed by the cycle's heartbeat: a holder lost with its machine is taken over
        # when it lapses, and the sweep must be taken over within 30 s (docs/REFERENCE.md).
        reconciliation_lease_seconds=_int(env, "BACKSTOP_RECONCILIATION_LEASE_SECONDS", 20, 2, 25),
        metrics_token=_metrics_token(env),
        # Whole days, at least one; webhook receipts are kept 7 days at least whatever is set
        # (shop.domain.retention).
        retention_days=_int(env, "RETENTION_DAYS", 30, 1, 3650),
        audit_retention_days=_int(env, "AUDIT_RETENTION_DAYS", 400, 1, 36500),
        prune_interval_seconds=_int(env, "PRUNE_INTERVAL_SECONDS", 3600, 60, 24 * 3600),
        web_front=_web_front(env),
        behind_front=_bool(env, "BACKSTOP_BEHIND_FRONT", False),
        log_format=_log_format(env),
        sentry_dsn=_sentry_dsn(env),
        shipping_countries=_countries(env, "SHIPPING_COUNTRIES", DEFAULT_SHIPPING_COUNTRIES),
    )
