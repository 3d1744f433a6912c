"""Settings: read from the environment once, when the app is created, and validated.

A bad value stops the process with one line naming the variable (docs/REFERENCE.md, Settings): a shop
that starts half-configured loses orders quietly, which is worse than not starting. Each variable
is read and checked on its own in settings_values.py; here are the defaults, the settings checked
against one another (the payment window, the web's threads, liveness, SECRET_KEY) and their assembly.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import asdict, dataclass

from .domain.payment import CaptureMode, TaxMode
from .settings_values import (
    DEFAULT_MAIL_FROM,
    SettingsError,
    TrustedProxies,
    env_bool,
    env_capture_mode,
    env_countries,
    env_database_url,
    env_int,
    env_log_format,
    env_mail_address,
    env_metrics_token,
    env_node_name,
    env_payment_methods,
    env_pooler,
    env_redis_url,
    env_sentry_dsn,
    env_shop_contact,
    env_smtp_ca_file,
    env_smtp_url,
    env_tax_mode,
    env_trusted_proxies,
    env_url,
    env_web_front,
)

# The largest quantity the cart's forms take for one line (orders.cart uses the same bound).
MOST_OF_ONE_ITEM = 99


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


@dataclass(frozen=True)
class Settings:
    """Every setting as load_settings read and checked it; each default is stated where it is read."""

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
    node_name: str
    reconciliation_lease_seconds: int
    web_concurrency: int
    web_threads: int
    stripe_max_concurrent_calls: int
    stripe_rate_limit_per_second: int
    stripe_endpoint_rate_limit_per_second: int
    stripe_breaker_threshold: int
    stripe_breaker_cooldown_seconds: int
    # Hoarding limits (docs/REFERENCE.md, Settings): live unpaid orders one browser or one email
    # may hold at once, and units of one item per cart line; beyond them checkout refuses.
    unpaid_orders_per_client: int
    # UNPAID_ORDERS_PER_ADDRESS: live unpaid orders placed from one client address (an office
    # behind one NAT shares it, hence generous): bounds fresh cookies with fresh emails.
    unpaid_orders_per_address: int
    # Customer emails about placing or ending an order (saga.mail_caps), per hour: to one
    # recipient, and about orders placed from one client address.
    order_emails_per_recipient: int
    order_emails_per_address: int
    max_line_quantity: int
    # METRICS_TOKEN: when set, /metrics answers only with `Authorization: Bearer <it>`.
    metrics_token: str | None
    # METRICS_PUBLIC: /metrics open without METRICS_TOKEN although PUBLIC_BASE_URL is not this
    # machine (shop.ops.routes); `flask shop up` sets it.
    metrics_public: bool
    # SMTP_CA_FILE: a PEM bundle trusted instead of the system's CAs when the mailer checks the
    # mail server's certificate (smtp+starttls://, smtps://).
    smtp_ca_file: str | None
    # WEB_FRONT: what `flask shop web` puts before gunicorn ("nginx", or "none" to run it bare).
    web_front: str
    # BACKSTOP_BEHIND_FRONT: set by `flask shop web` and `flask shop up` for the gunicorn behind
    # their nginx: a request from a loopback peer carries the client's address in X-Forwarded-For.
    behind_front: bool
    # TRUSTED_PROXIES: the balancers before the web, whose X-Forwarded-For names the client
    # (settings_values.TrustedProxies; shop.web.proxies applies it).
    trusted_proxies: TrustedProxies
    # UNPAID_HOLD_WITHOUT_SESSION_SECONDS: how long an order that never had a payment session
    # holds its stock (at most the payment window; domain.deadlines.unpaid_hold_seconds).
    unpaid_hold_without_session_seconds: int
    # LOG_FORMAT: "text" (one line for people, the default) or "json" (one object per line; shop.logs).
    log_format: str
    # SENTRY_DSN: when set, errors of the web and the workers go to Sentry (shop.reporting).
    sentry_dsn: str | None
    # Retention (docs/REFERENCE.md, Settings): finished work, receipts and sweep cycles are pruned
    # after RETENTION_DAYS, operator actions after AUDIT_RETENTION_DAYS, by a periodic job that
    # runs every PRUNE_INTERVAL_SECONDS (shop.scheduling.retention).
    retention_days: int
    audit_retention_days: int
    prune_interval_seconds: int
    # SHIPPING_COUNTRIES: the countries a shipping address may be in (two-letter ISO codes).
    shipping_countries: tuple[str, ...]
    # PAYMENT_METHODS: the payment method types a session may offer (shop.domain.payment_methods).
    payment_methods: tuple[str, ...]
    # TAX_MODE: none (no tax, said on every session) or stripe (Stripe Tax adds exclusive tax).
    tax_mode: TaxMode
    # CAPTURE_MODE: checkout (money taken at payment) or dispatch (held, captured when shipped);
    # a hold lapsing within AUTHORIZATION_WARNING_SECONDS is shown to operators, and an unshipped
    # order is voided and cancelled AUTHORIZATION_MARGIN_SECONDS before it lapses.
    capture_mode: CaptureMode
    authorization_warning_seconds: int
    authorization_margin_seconds: int
    # MAIL_FROM, MAIL_REPLY_TO: every email's From and, when set, Reply-To; SHOP_CONTACT: how a
    # customer reaches the shop (an email address or a URL), in the storefront's footer and in
    # every email (shop.emails).
    mail_from: str
    mail_reply_to: str | None
    shop_contact: str | None

    @property
    def uses_sandbox(self) -> bool:
        return not self.stripe_secret_key

    def as_config(self) -> dict:
        return {k.upper(): v for k, v in asdict(self).items()}


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
    expiry = env_int(env, "UNPAID_ORDER_EXPIRY_SECONDS", 1800, 1, 7 * 24 * 3600)
    stuck = env_int(env, "RECONCILIATION_STUCK_AGE_SECONDS", 1800, 1, 7 * 24 * 3600)
    if stuck != expiry:
        raise SettingsError(
            "RECONCILIATION_STUCK_AGE_SECONDS",
            f"must equal UNPAID_ORDER_EXPIRY_SECONDS ({expiry}), got {stuck}: the sweep and the "
            "per-order deadline must agree on one payment window",
        )
    hold = env_int(
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
    20 of them), at most 1/8 more wait briefly for a slot (provider.guard), and at least a quarter
    always serve everything else."""
    web_threads = env_int(env, "WEB_THREADS", DEFAULT_WEB_THREADS, 1, 256)
    most_calls = max(1, web_threads - 1)
    max_calls = env_int(env, "STRIPE_MAX_CONCURRENT_CALLS", default_max_concurrent_calls(web_threads), 1, 256)
    if max_calls > most_calls:
        raise SettingsError(
            "STRIPE_MAX_CONCURRENT_CALLS",
            f"must be between 1 and {most_calls} (WEB_THREADS - 1, so a thread is always "
            f"free for pages that do not wait on the provider), got {max_calls}",
        )
    return web_threads, max_calls


def _liveness(env) -> tuple[int, int]:
    """(SCHEDULER_POLL_SECONDS, HEALTH_STALE_SECONDS)."""
    poll = env_int(env, "SCHEDULER_POLL_SECONDS", 1, 1, 3600)
    stale = env_int(env, "HEALTH_STALE_SECONDS", 60, 2, 24 * 3600)
    if stale <= poll:
        raise SettingsError(
            "HEALTH_STALE_SECONDS",
            f"must be greater than SCHEDULER_POLL_SECONDS ({poll}), got {stale}: the scheduler beats once "
            "per poll, so a healthy one would look stalled between polls",
        )
    return poll, stale


def _authorization(env) -> tuple[int, int]:
    """AUTHORIZATION_WARNING_SECONDS and AUTHORIZATION_MARGIN_SECONDS: the margin is within a
    card hold's shortest life (a day), and the warning comes before the void."""
    warning = env_int(env, "AUTHORIZATION_WARNING_SECONDS", 86400, 60, 30 * 86400)
    margin = env_int(env, "AUTHORIZATION_MARGIN_SECONDS", 3600, 60, 86400)
    if margin >= warning:
        raise SettingsError(
            "AUTHORIZATION_MARGIN_SECONDS",
            f"must be less than AUTHORIZATION_WARNING_SECONDS ({warning}), got {margin}: operators are "
            "warned about a hold before it is voided",
        )
    return warning, margin


# The settings that are one whole number each and nothing more, in the order they are checked:
# the field, its variable, its default and its bounds (docs/REFERENCE.md, Settings).
_WHOLE_NUMBERS = (
    ("web_concurrency", "WEB_CONCURRENCY", DEFAULT_WEB_CONCURRENCY, 1, 64),
    # Stripe allows 100/s in live mode: stay below it with room for the dashboard and other tools.
    ("stripe_rate_limit_per_second", "STRIPE_RATE_LIMIT_PER_SECOND", 80, 2, 10_000),
    # Stripe also limits each endpoint (method + path template) to 25/s by default.
    ("stripe_endpoint_rate_limit_per_second", "STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND", 20, 1, 10_000),
    ("stripe_breaker_threshold", "BACKSTOP_STRIPE_BREAKER_THRESHOLD", 5, 1, 1_000_000),
    ("stripe_breaker_cooldown_seconds", "BACKSTOP_STRIPE_BREAKER_COOLDOWN_SECONDS", 30, 1, 3600),
    ("stripe_session_min_seconds", "STRIPE_SESSION_MIN_SECONDS", 1800, 0, 24 * 3600),
    ("reconciliation_interval_seconds", "RECONCILIATION_INTERVAL_SECONDS", 600, 1, 24 * 3600),
    ("reconciliation_batch_size", "RECONCILIATION_BATCH_SIZE", 50, 1, 1000),
    ("outbox_max_attempts", "OUTBOX_MAX_ATTEMPTS", 5, 1, 100),
    ("unpaid_orders_per_client", "UNPAID_ORDERS_PER_CLIENT", 3, 1, 1000),
    ("unpaid_orders_per_address", "UNPAID_ORDERS_PER_ADDRESS", 20, 1, 100_000),
    ("order_emails_per_recipient", "ORDER_EMAILS_PER_RECIPIENT", 5, 1, 1000),
    ("order_emails_per_address", "ORDER_EMAILS_PER_ADDRESS", 20, 1, 100_000),
    # At most the form's own bound (orders.cart.MOST_OF_ONE_ITEM): a larger limit would never bind.
    ("max_line_quantity", "MAX_LINE_QUANTITY", 10, 1, MOST_OF_ONE_ITEM),
    ("login_max_failures_per_account", "LOGIN_MAX_FAILURES_PER_ACCOUNT", 5, 1, 1000),
    ("login_max_failures_per_address", "LOGIN_MAX_FAILURES_PER_ADDRESS", 20, 1, 100_000),
    ("login_failure_window_seconds", "LOGIN_FAILURE_WINDOW_SECONDS", 900, 1, 24 * 3600),
    ("console_idle_timeout_seconds", "CONSOLE_IDLE_TIMEOUT_SECONDS", 1800, 60, 7 * 24 * 3600),
    ("checkout_return_per_minute", "CHECKOUT_RETURN_PER_MINUTE", 30, 1, 100_000),
    ("outbox_lease_seconds", "BACKSTOP_OUTBOX_LEASE_SECONDS", 25, 1, 3600),
    # Short and renewed by the cycle's heartbeat: a holder lost with its machine is taken over
    # when it lapses, and the sweep must be taken over within 30 s (docs/REFERENCE.md).
    ("reconciliation_lease_seconds", "BACKSTOP_RECONCILIATION_LEASE_SECONDS", 20, 2, 25),
    # Whole days, at least one; webhook receipts are kept 7 days at least whatever is set
    # (shop.domain.retention).
    ("retention_days", "RETENTION_DAYS", 30, 1, 3650),
    ("audit_retention_days", "AUDIT_RETENTION_DAYS", 400, 1, 36500),
    ("prune_interval_seconds", "PRUNE_INTERVAL_SECONDS", 3600, 60, 24 * 3600),
)


def load_settings(env=None, instance_path: str = "instance", argv=None) -> Settings:
    """Every setting read from `env` and checked, in the order a bad value is reported: those
    checked against one another, the whole numbers, then the rest."""
    env = os.environ if env is None else env
    database_url = env_database_url(env, instance_path)
    secret_key, ephemeral = _secret_key(env, argv)
    expiry, stuck, hold = _payment_window(env)
    web_threads, max_calls = _web_threads(env)
    poll, stale = _liveness(env)
    warning, margin = _authorization(env)

    whole = {field: env_int(env, name, default, lo, hi) for field, name, default, lo, hi in _WHOLE_NUMBERS}
    return Settings(
        **whole,
        web_threads=web_threads,
        stripe_max_concurrent_calls=max_calls,
        database_url=database_url,
        database_pooler=env_pooler(env, database_url),
        redis_url=env_redis_url(env),
        secret_key=secret_key,
        secret_key_ephemeral=ephemeral,
        public_base_url=env_url(env, "PUBLIC_BASE_URL", "http://127.0.0.1:5000", ["http://", "https://"]),
        stripe_secret_key=(env.get("STRIPE_SECRET_KEY") or "").strip() or None,
        stripe_webhook_secret=(env.get("STRIPE_WEBHOOK_SECRET") or "").strip() or None,
        stripe_api_base=env_url(env, "STRIPE_API_BASE", None, ["http://", "https://"]),
        unpaid_order_expiry_seconds=expiry,
        unpaid_hold_without_session_seconds=hold,
        reconciliation_stuck_age_seconds=stuck,
        reconciliation_enabled=env_bool(env, "RECONCILIATION_ENABLED", True),
        unpaid_order_expiry_enabled=env_bool(env, "UNPAID_ORDER_EXPIRY_ENABLED", True),
        scheduler_poll_seconds=poll,
        health_stale_seconds=stale,
        # An unknown scheme (a typo of smtps://) would otherwise send in clear text.
        smtp_url=env_smtp_url(env),
        smtp_ca_file=env_smtp_ca_file(env),
        mail_from=env_mail_address(env, "MAIL_FROM", DEFAULT_MAIL_FROM) or DEFAULT_MAIL_FROM,
        mail_reply_to=env_mail_address(env, "MAIL_REPLY_TO", None),
        shop_contact=env_shop_contact(env),
        queue_prefix=(env.get("BACKSTOP_QUEUE_PREFIX") or "").strip() or "backstop",
        node_name=env_node_name(env),
        metrics_token=env_metrics_token(env),
        metrics_public=env_bool(env, "METRICS_PUBLIC", False),
        web_front=env_web_front(env),
        behind_front=env_bool(env, "BACKSTOP_BEHIND_FRONT", False),
        trusted_proxies=env_trusted_proxies(env),
        log_format=env_log_format(env),
        sentry_dsn=env_sentry_dsn(env),
        shipping_countries=env_countries(env, "SHIPPING_COUNTRIES", DEFAULT_SHIPPING_COUNTRIES),
        payment_methods=env_payment_methods(env),
        tax_mode=env_tax_mode(env),
        capture_mode=env_capture_mode(env),
        authorization_warning_seconds=warning,
        authorization_margin_seconds=margin,
    )
