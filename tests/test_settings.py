"""Settings are validated when the app is created (docs/REFERENCE.md, Settings): a bad value stops the
process with one line naming the variable, and a web server never starts without SECRET_KEY."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shop import create_app
from shop.domain.payment import TaxMode
from shop.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CLI = ["/venv/bin/flask", "--app", "app", "shop", "worker"]  # a CLI command: SECRET_KEY may be generated

BAD = [
    ("UNPAID_ORDER_EXPIRY_SECONDS", "soon", "whole number"),
    ("UNPAID_ORDER_EXPIRY_SECONDS", "0", "between"),
    ("UNPAID_ORDER_EXPIRY_SECONDS", "1.5", "whole number"),
    ("STRIPE_SESSION_MIN_SECONDS", "-1", "between"),
    ("STRIPE_SESSION_MIN_SECONDS", "86401", "between"),
    ("RECONCILIATION_INTERVAL_SECONDS", "ten", "whole number"),
    ("RECONCILIATION_INTERVAL_SECONDS", "0", "between"),
    ("RECONCILIATION_STUCK_AGE_SECONDS", "60", "must equal UNPAID_ORDER_EXPIRY_SECONDS"),
    # The hold of an order without a payment page: never longer than the window of one with it.
    (
        "UNPAID_HOLD_WITHOUT_SESSION_SECONDS",
        "1801",
        "must not be longer than UNPAID_ORDER_EXPIRY_SECONDS (1800), got 1801",
    ),
    ("UNPAID_HOLD_WITHOUT_SESSION_SECONDS", "0", "between 1 and 604800"),
    ("UNPAID_HOLD_WITHOUT_SESSION_SECONDS", "ten minutes", "whole number"),
    ("RECONCILIATION_STUCK_AGE_SECONDS", "x", "whole number"),
    ("RECONCILIATION_BATCH_SIZE", "0", "between 1 and 1000"),
    ("RECONCILIATION_BATCH_SIZE", "1001", "between 1 and 1000"),
    ("RECONCILIATION_ENABLED", "maybe", "true or false"),
    ("UNPAID_ORDER_EXPIRY_ENABLED", "2", "true or false"),
    ("OUTBOX_MAX_ATTEMPTS", "0", "between"),
    ("OUTBOX_MAX_ATTEMPTS", "five", "whole number"),
    ("RETENTION_DAYS", "0", "between 1 and 3650"),
    ("RETENTION_DAYS", "a month", "whole number"),
    ("AUDIT_RETENTION_DAYS", "0", "between 1 and 36500"),
    ("AUDIT_RETENTION_DAYS", "a year", "whole number"),
    ("PRUNE_INTERVAL_SECONDS", "10", "between 60 and 86400"),
    ("SCHEDULER_POLL_SECONDS", "0", "between"),
    ("HEALTH_STALE_SECONDS", "a minute", "whole number"),
    ("HEALTH_STALE_SECONDS", "1", "between 2 and"),
    ("DATABASE_URL", "mysql://root@localhost/shop", "must start with"),
    ("DATABASE_POOLER", "pgpool", "must be one of none, pgbouncer"),
    ("DATABASE_POOLER", "pgbouncer", "not PostgreSQL"),  # in front of the default SQLite file
    ("REDIS_URL", "http://127.0.0.1:6379", "must start with"),
    ("REDIS_URL", "redis+sentinel://127.0.0.1:26379", "SERVICE"),  # no service named
    ("REDIS_URL", "redis+sentinel://127.0.0.1/backstop", "a Sentinel is HOST:PORT"),
    ("REDIS_URL", "redis+sentinel://127.0.0.1:26379/backstop/zero", "is a number"),
    ("PUBLIC_BASE_URL", "ftp://shop.example", "must start with"),
    ("PUBLIC_BASE_URL", "shop.example", "must start with"),
    ("STRIPE_API_BASE", "127.0.0.1:12111", "must start with"),
    ("WEB_CONCURRENCY", "0", "between 1 and 64"),
    ("WEB_THREADS", "many", "whole number"),
    ("WEB_THREADS", "257", "between 1 and 256"),
    ("STRIPE_MAX_CONCURRENT_CALLS", "32", "WEB_THREADS - 1"),  # all 32 default threads: none left for pages
    ("STRIPE_MAX_CONCURRENT_CALLS", "0", "between"),
    ("STRIPE_RATE_LIMIT_PER_SECOND", "1", "between 2 and 10000"),
    ("STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND", "0", "between 1 and 10000"),
    ("BACKSTOP_NODE_NAME", "web:2", "must not contain ':'"),  # identities are node:pid:...
    ("BACKSTOP_NODE_NAME", "n" * 61, "at most 60 characters, got 61"),
    ("BACKSTOP_NODE_NAME", "web 2", "printable, without spaces"),
    ("BACKSTOP_NODE_NAME", "web\x072", "printable, without spaces"),
    # The sweep's lease: renewed by a heartbeat every quarter of it, so 1 s would beat every
    # 0.25 s; past 25 s a holder lost with its machine is no longer taken over within 30 s.
    ("BACKSTOP_RECONCILIATION_LEASE_SECONDS", "1", "between 2 and 25"),
    ("BACKSTOP_RECONCILIATION_LEASE_SECONDS", "300", "between 2 and 25"),
    # The hoarding limits: at least one order and one unit, at most the cart forms' 99 units.
    ("UNPAID_ORDERS_PER_CLIENT", "0", "between 1 and 1000"),
    ("UNPAID_ORDERS_PER_CLIENT", "1001", "between 1 and 1000"),
    ("UNPAID_ORDERS_PER_CLIENT", "three", "whole number"),
    ("UNPAID_ORDERS_PER_ADDRESS", "0", "between 1 and 100000"),
    ("ORDER_EMAILS_PER_RECIPIENT", "1001", "between 1 and 1000"),
    ("ORDER_EMAILS_PER_ADDRESS", "many", "whole number"),
    ("MAX_LINE_QUANTITY", "0", "between 1 and 99"),
    ("MAX_LINE_QUANTITY", "500", "between 1 and 99"),
    ("MAX_LINE_QUANTITY", "2.5", "whole number"),
    # The return page's throttle: at least one request a minute per address.
    ("CHECKOUT_RETURN_PER_MINUTE", "0", "between 1 and 100000"),
    ("CHECKOUT_RETURN_PER_MINUTE", "thirty", "whole number"),
    # A scraper's secret: long enough not to be guessed, and sendable as it is in a header.
    ("METRICS_TOKEN", "short-token", "at least 16 characters, got 11"),
    ("METRICS_TOKEN", "a token with spaces", "printable ASCII without spaces"),
    ("METRICS_TOKEN", "t\u00f6ken-with-umlaut-0123", "printable ASCII without spaces"),
    # A misspelt scheme would send in clear text; the message names the scheme, not the password.
    ("SMTP_URL", "smtp+ssl://shop@mail.example:465", "must start with one of smtp://, smtp+starttls://, smtps://"),
    ("SMTP_URL", "mail.example:25", "got no scheme"),
    ("SMTP_CA_FILE", "/nonexistent/private-ca.pem", "no such file: '/nonexistent/private-ca.pem'"),
    ("SMTP_CA_FILE", "/", "no such file"),  # a folder is not a bundle
    # Text for people or JSON for machines, nothing else (docs/REFERENCE.md, Logs).
    ("LOG_FORMAT", "xml", "must be one of text, json, got 'xml'"),
    ("LOG_FORMAT", "logfmt", "must be one of text, json"),
    # A DSN is http(s)://KEY@HOST/PROJECT; the message never repeats it (the key would reach the log).
    ("SENTRY_DSN", "ftp://key@sentry.example/1", "must start with one of http://, https://, got ftp://"),
    ("SENTRY_DSN", "sentry.example/1", "got no scheme"),
    ("SENTRY_DSN", "https://sentry.example/1", "must name a key and a host"),
    ("SENTRY_DSN", "https://key@sentry.example", "must end with the project"),
    ("SENTRY_DSN", "https://key@sentry.example:port/1", "is not a URL"),
    # A method whose money could arrive after an order's pay-by time (docs/REFERENCE.md, Settings).
    ("PAYMENT_METHODS", "card,oxxo", "oxxo is a voucher, payable for days"),
    ("PAYMENT_METHODS", "sepa_debit", "sepa_debit is a bank debit, confirmed in days"),
    ("PAYMENT_METHODS", "card,chequebook", "chequebook is not a payment method type this shop knows"),
    ("PAYMENT_METHODS", ",", "must name at least one payment method type"),
    ("TAX_MODE", "vat", "must be one of none, stripe, got 'vat'"),
    # Every email's sender and where answers go: one address each, on one line (no header smuggled in).
    ("MAIL_FROM", "shop.example", "must be one email address"),
    ("MAIL_FROM", "Shop <shop@example>", "must be one email address"),  # no dot in the domain
    ("MAIL_FROM", "a@shop.example, b@shop.example", "must be one email address"),
    ("MAIL_FROM", "Shop <shop@shop.example>\nBcc: all@elsewhere.example", "must be one line"),
    ("MAIL_REPLY_TO", "help desk@shop.example", "must be one email address"),
    ("MAIL_REPLY_TO", "@shop.example", "must be one email address"),
    # How customers reach the shop: an address or a web page, nothing a customer could not use.
    ("SHOP_CONTACT", "call us", "must be an email address (help@shop.example) or an http(s):// URL"),
    ("SHOP_CONTACT", "ftp://shop.example/contact", "or an http(s):// URL"),
    ("SHOP_CONTACT", "https:///contact", "an http(s):// URL with a host"),
    ("SHOP_CONTACT", "Help <help@shop.example>", "must be an email address"),
]


@pytest.mark.parametrize("variable,value,problem", BAD, ids=[f"{v}={x}" for v, x, _ in BAD])
def test_a_bad_value_is_refused_naming_the_variable(variable, value, problem, tmp_path):
    with pytest.raises(SettingsError) as caught:
        load_settings({variable: value}, str(tmp_path), argv=CLI)
    assert caught.value.variable == variable
    message = str(caught.value)
    assert message.startswith(f"{variable}: ") and problem in message and "\n" not in message


def test_the_hold_without_a_session_is_600_s_or_the_window_when_shorter_and_never_longer_than_it(tmp_path):
    def hold(**env) -> int:
        return load_settings(env, str(tmp_path), argv=CLI).as_config()["UNPAID_HOLD_WITHOUT_SESSION_SECONDS"]

    assert hold() == 600
    assert hold(UNPAID_HOLD_WITHOUT_SESSION_SECONDS=" 120 ") == 120
    assert hold(UNPAID_HOLD_WITHOUT_SESSION_SECONDS="1800") == 1800  # as long as the window: allowed
    short = {"UNPAID_ORDER_EXPIRY_SECONDS": "300", "RECONCILIATION_STUCK_AGE_SECONDS": "300"}
    assert hold(**short) == 300  # unset: the default never outlasts a shorter window
    with pytest.raises(SettingsError) as caught:
        load_settings({**short, "UNPAID_HOLD_WITHOUT_SESSION_SECONDS": "600"}, str(tmp_path), argv=CLI)
    assert str(caught.value) == (
        "UNPAID_HOLD_WITHOUT_SESSION_SECONDS: must not be longer than UNPAID_ORDER_EXPIRY_SECONDS (300), "
        "got 600: an order without a payment page would be held longer than one with it"
    )


def test_a_bad_metrics_token_is_refused_without_repeating_it(tmp_path):
    """The line goes to a log; the token is a secret, even a bad one (it may be the real one, cut)."""
    for value in ("0123456789", "sixteen chars but\tone tab"):
        with pytest.raises(SettingsError) as caught:
            load_settings({"METRICS_TOKEN": value}, str(tmp_path), argv=CLI)
        assert caught.value.variable == "METRICS_TOKEN" and value not in str(caught.value)


def test_the_metrics_token_is_unset_unless_given_and_read_stripped(tmp_path):
    assert load_settings({}, str(tmp_path), argv=CLI).metrics_token is None
    assert load_settings({"METRICS_TOKEN": "   "}, str(tmp_path), argv=CLI).metrics_token is None  # blank is unset
    token = "Zx9-scrape.token_0123456789+/="
    s = load_settings({"METRICS_TOKEN": f" {token} "}, str(tmp_path), argv=CLI)
    assert s.metrics_token == token and s.as_config()["METRICS_TOKEN"] == token
    assert load_settings({"METRICS_TOKEN": "x" * 16}, str(tmp_path), argv=CLI).metrics_token == "x" * 16


def test_smtp_settings_are_read_and_a_bad_one_never_repeats_the_password(tmp_path):
    with pytest.raises(SettingsError) as caught:
        load_settings({"SMTP_URL": "smtp+tls://shop:s3cret@mail.example"}, str(tmp_path), argv=CLI)
    assert caught.value.variable == "SMTP_URL" and "s3cret" not in str(caught.value)
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(SettingsError, match="^SMTP_CA_FILE: is not a PEM certificate bundle"):
        load_settings({"SMTP_CA_FILE": str(not_pem)}, str(tmp_path), argv=CLI)
    if os.geteuid() != 0:  # root reads any file
        not_pem.chmod(0)
        with pytest.raises(SettingsError, match="^SMTP_CA_FILE: cannot be read"):
            load_settings({"SMTP_CA_FILE": str(not_pem)}, str(tmp_path), argv=CLI)

    defaults = load_settings({}, str(tmp_path), argv=CLI)
    assert defaults.smtp_url is None and defaults.smtp_ca_file is None
    ca = tmp_path / "private-ca.pem"
    ca.write_text(_A_CERTIFICATE)
    for url in ("smtp://mail.example", "smtp+starttls://u:p@mail.example:587", "smtps://mail.example"):
        s = load_settings({"SMTP_URL": f" {url} ", "SMTP_CA_FILE": str(ca)}, str(tmp_path), argv=CLI)
        assert (s.smtp_url, s.smtp_ca_file, s.as_config()["SMTP_CA_FILE"]) == (url, str(ca), str(ca))


def test_a_bad_value_stops_create_app_too(tmp_path):
    with pytest.raises(SettingsError, match="^OUTBOX_MAX_ATTEMPTS: "):
        create_app(env={"OUTBOX_MAX_ATTEMPTS": "lots", "SECRET_KEY": "k"})


def test_defaults_and_good_values_are_read_and_typed(tmp_path):
    defaults = load_settings({}, str(tmp_path), argv=CLI)
    assert (defaults.unpaid_order_expiry_seconds, defaults.reconciliation_stuck_age_seconds) == (1800, 1800)
    assert (defaults.reconciliation_batch_size, defaults.outbox_max_attempts) == (50, 5)
    assert defaults.reconciliation_enabled is defaults.unpaid_order_expiry_enabled is True
    assert defaults.database_url == f"sqlite:///{tmp_path}/backstop.sqlite3"
    assert defaults.secret_key and defaults.secret_key_ephemeral and defaults.uses_sandbox
    assert (
        defaults.web_concurrency,
        defaults.web_threads,
        defaults.stripe_max_concurrent_calls,
        defaults.stripe_rate_limit_per_second,
    ) == (2, 32, 20, 80)
    # The bulkhead follows the threads (5/8) unless set, and always leaves one free.
    assert load_settings({"WEB_THREADS": "9"}, str(tmp_path), argv=CLI).stripe_max_concurrent_calls == 5
    assert load_settings({"WEB_THREADS": "1"}, str(tmp_path), argv=CLI).stripe_max_concurrent_calls == 1
    assert (
        load_settings(
            {"WEB_THREADS": "4", "STRIPE_MAX_CONCURRENT_CALLS": "3"}, str(tmp_path), argv=CLI
        ).stripe_max_concurrent_calls
        == 3
    )
    assert defaults.health_stale_seconds == 60
    assert (defaults.unpaid_orders_per_client, defaults.max_line_quantity) == (3, 10)
    limits = load_settings({"UNPAID_ORDERS_PER_CLIENT": " 1 ", "MAX_LINE_QUANTITY": "99"}, str(tmp_path), argv=CLI)
    assert (limits.unpaid_orders_per_client, limits.max_line_quantity) == (1, 99)
    assert defaults.reconciliation_lease_seconds == 20  # short: the heartbeat renews it
    assert (
        load_settings(
            {"BACKSTOP_RECONCILIATION_LEASE_SECONDS": "25"}, str(tmp_path), argv=CLI
        ).reconciliation_lease_seconds
        == 25
    )

    s = load_settings(
        {
            "UNPAID_ORDER_EXPIRY_SECONDS": " 60 ",
            "RECONCILIATION_STUCK_AGE_SECONDS": "60",
            "RECONCILIATION_ENABLED": "off",
            "UNPAID_ORDER_EXPIRY_ENABLED": "Yes",
            "DATABASE_URL": "postgresql://u@db/shop",
            "PUBLIC_BASE_URL": "https://shop.example/",
            "SECRET_KEY": "k",
            "RECONCILIATION_BATCH_SIZE": "1000",
        },
        str(tmp_path),
        argv=CLI,
    )
    assert (s.unpaid_order_expiry_seconds, s.reconciliation_stuck_age_seconds) == (60, 60)
    assert s.reconciliation_enabled is False and s.unpaid_order_expiry_enabled is True
    assert s.database_url == "postgresql+psycopg://u@db/shop"  # the driver we ship, not psycopg2
    assert s.public_base_url == "https://shop.example"
    assert (s.secret_key, s.secret_key_ephemeral, s.reconciliation_batch_size) == ("k", False, 1000)


def test_the_node_name_is_the_host_name_unless_set(tmp_path):
    assert load_settings({}, str(tmp_path), argv=CLI).node_name == socket.gethostname()[:60]
    assert load_settings({"BACKSTOP_NODE_NAME": "  "}, str(tmp_path), argv=CLI).node_name == socket.gethostname()[:60]
    named = load_settings({"BACKSTOP_NODE_NAME": " web-2.eu_west "}, str(tmp_path), argv=CLI)
    assert named.node_name == "web-2.eu_west" and named.as_config()["NODE_NAME"] == "web-2.eu_west"
    assert load_settings({"BACKSTOP_NODE_NAME": "n" * 60}, str(tmp_path), argv=CLI).node_name == "n" * 60


def test_a_staleness_limit_a_healthy_scheduler_would_exceed_between_polls_is_refused(tmp_path):
    with pytest.raises(SettingsError) as caught:
        load_settings({"SCHEDULER_POLL_SECONDS": "30", "HEALTH_STALE_SECONDS": "30"}, str(tmp_path), argv=CLI)
    assert caught.value.variable == "HEALTH_STALE_SECONDS" and "SCHEDULER_POLL_SECONDS (30)" in str(caught.value)
    ok = load_settings({"SCHEDULER_POLL_SECONDS": "30", "HEALTH_STALE_SECONDS": "31"}, str(tmp_path), argv=CLI)
    assert ok.health_stale_seconds == 31


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/bin/gunicorn", "app:app"],
        ["/venv/bin/flask", "--app", "app", "run"],
        ["/usr/bin/uwsgi", "--module", "app:app"],
        ["-c"],
        [],
        ["/venv/lib/python3.11/site-packages/flask/__main__.py", "run"],
    ],
)
def test_a_web_server_needs_a_shared_secret_key(argv, tmp_path):
    """Anything that may serve pages: gunicorn, `flask run`, and any other host importing app.py."""
    with pytest.raises(SettingsError) as caught:
        load_settings({}, str(tmp_path), argv=argv)
    assert caught.value.variable == "SECRET_KEY"
    assert load_settings({"SECRET_KEY": "shared"}, str(tmp_path), argv=argv).secret_key == "shared"


@pytest.mark.parametrize(
    "argv",
    [
        ["/venv/bin/flask", "--app", "app", "db", "upgrade"],
        ["/venv/bin/flask", "shop", "up"],
        ["/venv/lib/python3.11/site-packages/flask/__main__.py", "shop", "sweep"],
    ],
)
def test_cli_commands_that_serve_no_pages_run_without_a_secret_key(argv, tmp_path):
    settings = load_settings({}, str(tmp_path), argv=argv)
    assert settings.secret_key and settings.secret_key_ephemeral


def _env(**extra) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "SECRET_KEY",
            "DATABASE_URL",
            "UNPAID_ORDER_EXPIRY_SECONDS",
            "RECONCILIATION_STUCK_AGE_SECONDS",
            "FLASK_APP",
        }
    }
    env.update(extra)
    return env


def test_flask_cli_with_a_stuck_age_unlike_the_expiry_window_exits_with_one_line(tmp_path):
    proc = subprocess.run(
        [str(BIN / "flask"), "--app", "app", "routes"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(
            UNPAID_ORDER_EXPIRY_SECONDS="900",
            RECONCILIATION_STUCK_AGE_SECONDS="1800",
            BACKSTOP_INSTANCE_PATH=str(tmp_path),
        ),
    )
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert "RECONCILIATION_STUCK_AGE_SECONDS" in lines[0] and "Traceback" not in lines[0]


def test_importing_the_app_without_a_secret_key_stops_with_one_line(tmp_path):
    """uwsgi, mod_wsgi, waitress or a REPL import app.py the way this does."""
    proc = subprocess.run(
        [sys.executable, "-c", "import app"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(BACKSTOP_INSTANCE_PATH=str(tmp_path)),
    )
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "SECRET_KEY" in lines[0], proc.stdout + proc.stderr


def test_gunicorn_without_a_secret_key_refuses_to_start(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [str(BIN / "gunicorn"), "app:app", "-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(BACKSTOP_INSTANCE_PATH=str(tmp_path)),
    )
    assert proc.returncode != 0  # the master halts; it does not respawn a worker that cannot start
    assert "SECRET_KEY" in proc.stderr and "Traceback" not in proc.stderr


UNPROTECTED = [
    ("redis://10.0.0.5:6379/0", ["10.0.0.5:6379"]),
    ("redis://redis.internal/0", ["redis.internal"]),
    ("redis://user@10.0.0.5:6379/0", ["10.0.0.5:6379"]),  # a user name without a password
    ("redis+sentinel://10.0.0.7:26379,127.0.0.1:26379/mymaster", ["10.0.0.7:26379"]),
    ("redis://127.0.0.1:6379/0", []),
    ("redis://localhost/1", []),
    ("redis://[::1]:6379", []),
    ("redis://:s3cret@10.0.0.5:6379/0", []),
    ("redis://10.0.0.5:6379/0?password=s3cret", []),
    ("redis+sentinel://:s3cret@10.0.0.7:26379/mymaster", []),
    ("redis+sentinel://127.0.0.1:26379/mymaster/2", []),
    ("rediss://10.0.0.5:6380/0", []),
    ("unix:///run/redis.sock", []),
]


@pytest.mark.parametrize("url,hosts", UNPROTECTED, ids=[u for u, _ in UNPROTECTED])
def test_redis_beyond_this_machine_without_a_password_is_named(url, hosts):
    from shop.redis_client import unprotected_redis_hosts

    assert unprotected_redis_hosts(url) == hosts


@pytest.mark.parametrize("url", ["redis://10.0.0.5:6379/0", "redis+sentinel://10.0.0.7:26379/mymaster"])
def test_starting_with_an_unprotected_remote_redis_logs_one_warning_naming_redis_url(url, caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="shop"):
        create_app(env={"REDIS_URL": url, "SECRET_KEY": "k", "DATABASE_URL": f"sqlite:///{tmp_path}/shop.db"})
    lines = [r for r in caplog.records if "REDIS_URL" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "no password" in lines[0].getMessage() and url.split("//")[1].split("/")[0] in lines[0].getMessage()


def test_starting_with_a_local_or_password_protected_redis_logs_no_warning(caplog, tmp_path):
    for url in ("redis://127.0.0.1:6379/0", "redis://:s3cret@10.0.0.5:6379/0"):
        with caplog.at_level(logging.WARNING, logger="shop"):
            create_app(env={"REDIS_URL": url, "SECRET_KEY": "k", "DATABASE_URL": f"sqlite:///{tmp_path}/shop.db"})
    assert not [r for r in caplog.records if "REDIS_URL" in r.getMessage()]


# A certificate to trust (its key was thrown away): SMTP_CA_FILE only has to parse as PEM.
_A_CERTIFICATE = """\
-----BEGIN CERTIFICATE-----
MIIDBTCCAe2gAwIBAgIUAWeRvQNqz/z8emFJ92o9W850IwswDQYJKoZIhvcNAQEL
BQAwEjEQMA4GA1UEAwwHdGVzdC1jYTAeFw0yNjEyMDIxMTU4MjZaFw0zNjExMjkx
MTU4MjZaMBIxEDAOBgNVBAMMB3Rlc3QtY2EwggEiMA0GCSqGSIb3DQEBAQUAA4IB
DwAwggEKAoIBAQCsR6szNvKM9pu8PRdrUuDSWJB9lgMR84eonQqn/UGFW5DudoMp
DljF036ZIWHxnQMkx1EyvheCoPpyCG3eegrtsyXC4BWQlvTiRUrzFUwk1RfnfZa5
y49obGN4qn4fm8P2BLv5fEH4z7epJzY4oBtp7XXLFgqb38CoHGT9ACVIo8Bbz74I
QoUQfULMjXEA0AM1nZ816OKeo5bBOMZ4zU/tMyNjC/S+aUGSWiHjd0+I9ItC1cQO
jB+NNgY3MVk4epcsl7pX+0Wg63FHAzWzzp/YZsdOQT7nd9jc2xp9TAs/9brGqKtY
HVpDXzZ2Ga4xtFPZMyWekJJ24z+jXg1VctcxAgMBAAGjUzBRMB0GA1UdDgQWBBTi
wHKos0TMgopMvI/JAHIhiK4AvzAfBgNVHSMEGDAWgBTiwHKos0TMgopMvI/JAHIh
iK4AvzAPBgNVHRMBAf8EBTADAQH/MA0GCSqGSIb3DQEBCwUAA4IBAQBFtDcTlWVb
qXONzk3zuvz2nHy/5QIRQrUvo0220P8lyu15z0yfGvpTkDEV/vrg2AD1k0ldpMXV
rCZenuP/WukbunMYvwgwNKzTOY8pEa3EApeMXfM6jxQI2sGAqB23D6DRm1Z+4Ytb
gatdgdoMOGixxpsZlniEDzfhhZR9N5X8wIrZ7D9PIIMnPyE+HBRZtSS/CD6P2mRO
IIfTgKJ+8UafIxOOKFhM8HIkRRpkxpXPqsb2ioS76OdYYIljIjmVhh2khcIPq5EU
2SFll84OpyE1iDUYU0zdNzqKIKfNl91guak+MnxfLmCUedifg3Ar5569lpZxP71f
F2cG1+ABiezq
-----END CERTIFICATE-----
"""


def test_log_format_is_text_unless_json_is_asked_for_and_sentry_is_off_unless_a_dsn_is_given(tmp_path):
    default = load_settings({}, str(tmp_path), argv=CLI)
    assert default.log_format == "text" and default.sentry_dsn is None
    chosen = load_settings(
        {"LOG_FORMAT": " JSON ", "SENTRY_DSN": "https://abc123@o1.ingest.sentry.io/42"}, str(tmp_path), argv=CLI
    )
    assert chosen.log_format == "json" and chosen.sentry_dsn == "https://abc123@o1.ingest.sentry.io/42"
    with pytest.raises(SettingsError) as refused:
        load_settings({"SENTRY_DSN": "ftp://secretkey@sentry.example/1"}, str(tmp_path), argv=CLI)
    assert "secretkey" not in str(refused.value)


def test_payment_methods_and_tax_mode_default_to_card_only_and_no_tax_and_are_read_as_given(tmp_path):
    default = load_settings({}, str(tmp_path), argv=CLI)
    assert (default.payment_methods, default.tax_mode) == (("card",), TaxMode.NONE)
    given = load_settings({"PAYMENT_METHODS": " Card, link,card ", "TAX_MODE": "STRIPE"}, str(tmp_path), argv=CLI)
    assert (given.payment_methods, given.tax_mode) == (("card", "link"), TaxMode.STRIPE)


def test_mail_comes_from_the_demo_sender_unless_mail_from_is_set_and_reply_to_and_contact_are_read_as_given(tmp_path):
    default = load_settings({}, str(tmp_path), argv=CLI)
    assert (default.mail_from, default.mail_reply_to, default.shop_contact) == (
        "Backstop shop <shop@localhost>",
        None,
        None,
    )
    given = load_settings(
        {
            "MAIL_FROM": " Caf\u00e9 Shop <orders@shop.example> ",
            "MAIL_REPLY_TO": "help@shop.example",
            "SHOP_CONTACT": " https://shop.example/contact ",
        },
        str(tmp_path),
        argv=CLI,
    )
    assert (given.mail_from, given.mail_reply_to, given.shop_contact) == (
        "Caf\u00e9 Shop <orders@shop.example>",
        "help@shop.example",
        "https://shop.example/contact",
    )
    assert load_settings({"SHOP_CONTACT": "help@shop.example"}, str(tmp_path), argv=CLI).shop_contact == (
        "help@shop.example"
    )


@pytest.mark.parametrize(
    "variable,value,line",
    [
        (
            "BACKSTOP_NODE_NAME",
            "web:2",
            "BACKSTOP_NODE_NAME: must not contain ':' (identities are node:pid:...), got 'web:2'",
        ),
        (
            "PAYMENT_METHODS",
            "card,konbini",
            "PAYMENT_METHODS: konbini is a voucher, payable for days: "
            "its money could arrive after an order's pay-by time",
        ),
        (
            "MAIL_FROM",
            "the shop",
            "MAIL_FROM: must be one email address, as `Name <shop@example.com>` or `shop@example.com`, got 'the shop'",
        ),
    ],
    ids=["node name", "voucher", "mail from"],
)
def test_a_bad_value_stops_the_worker_with_one_line_naming_the_variable(tmp_path, variable, value, line):
    proc = subprocess.run(
        [str(BIN / "flask"), "--app", "app", "shop", "worker", "--burst"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(**{variable: value}, BACKSTOP_INSTANCE_PATH=str(tmp_path)),
    )
    assert proc.returncode != 0
    lines = [text for text in (proc.stdout + proc.stderr).splitlines() if text.strip()]
    assert lines == [f"backstop: configuration error: {line}"], proc.stdout + proc.stderr
