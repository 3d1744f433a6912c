"""`flask shop check`, the deploy preflight (docs/REFERENCE.md, Commands): a node that is ready
passes every line and exits 0, on SQLite and PostgreSQL; each failing check fails its own line,
naming what to fix, and exits 1, against real services: a Redis started here with another eviction
policy, a replica, nothing listening, an unmigrated database, one a migration behind head, the
sandbox with no endpoint, one for another URL, one short of events, a key it refuses, web pools
above PostgreSQL's max_connections, and a bad setting. The database's clock cannot be moved, so the
clock check's failure is shown by moving this machine's (`run_checks(clock=...)`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest
import stripe
from redis import Redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from process_support import ROOT, flask_command, free_port, process_env
from shop.devserver.bundled_redis import redis_server_command
from shop.ops import database_checks, preflight
from shop.ops.redis_version import lua_fix_missing
from shop.provider.views import EVENT_TYPES
from shop.redis_client import redis_client as preflight_redis_client
from support import RUN_ID, UNREACHABLE_PROVIDER, redis_url, wait_until

TARGET = "http://127.0.0.1:5000/webhooks/stripe"  # base_config's PUBLIC_BASE_URL + the webhook's path
NAMES = [
    "settings",
    "database",
    "redis",
    "redis-auth",
    "redis-version",
    "provider",
    "webhook",
    "clock",
    "pools",
    "tracing",
]


def check(app, *args):
    """`flask shop check` on `app`: (exit code, {name: (label, detail)}, output)."""
    result = app.test_cli_runner().invoke(args=["shop", "check", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, _lines(result.output), result.output


def _lines(output: str) -> dict:
    lines = {}
    for line in output.splitlines():
        label, _, rest = line.partition(" ")
        name, _, detail = rest.strip().partition(": ")
        if label in ("ok", "warn", "FAIL"):
            lines[name] = (label, detail)
    return lines


def register(app):
    result = app.test_cli_runner().invoke(args=["shop", "stripe-register-webhook"])
    assert result.exit_code == 0, result.output


def endpoint(sandbox, url: str, events: list[str]):
    """An endpoint created at the sandbox through the stripe SDK, as a person would in a dashboard."""
    client = stripe.StripeClient("sk_test_someone", base_addresses={"api": sandbox.base_url})
    return client.v1.webhook_endpoints.create(params={"url": url, "enabled_events": events})


@pytest.fixture
def redis_servers():
    """Starts redis-server processes (`start(*extra args) -> port`), stopped when the test ends."""
    folder = tempfile.mkdtemp(prefix="backstop-check-redis-")
    procs = []

    def start(*extra: str) -> int:
        port = free_port()
        command = [*redis_server_command(shutil.which("redis-server"), port, folder), *extra]
        procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def answers():
            try:
                with Redis(port=port, socket_timeout=0.5) as r:
                    return r.ping()
            except Exception:  # noqa: BLE001 - not up yet
                return False

        wait_until(answers, 10, f"redis-server on {port}")
        return port

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def unmigrated_database_url(database_url):
    """An empty database beside the run's: a new SQLite file, or a new PostgreSQL database."""
    if not database_url.startswith("postgresql"):
        yield f"sqlite:///{tempfile.mkdtemp(prefix='backstop-check-')}/empty.sqlite3"
        return
    name = f"backstop_test_{RUN_ID}_unmigrated"
    admin = create_engine(make_url(database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


# -- ready ---------------------------------------------------------------------------------


def test_a_ready_node_passes_every_check_and_exits_0(make_fresh_app, sandbox, is_postgres):
    """The real entry point (`flask --app app shop check` in a process of its own), on this run's
    database (migrated), Redis (noeviction) and the sandbox with this shop's endpoint registered
    as `flask shop stripe-register-webhook` does, its secret stored in the database."""
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET=None)
    register(app)
    env = process_env(app, STRIPE_API_BASE=sandbox.base_url, PUBLIC_BASE_URL="http://127.0.0.1:5000")
    env.pop("STRIPE_WEBHOOK_SECRET")
    command = flask_command() + ["--app", "app", "shop", "check"]

    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    assert run.returncode == 0, run.stdout + run.stderr
    lines = _lines(run.stdout)
    assert list(lines) == NAMES
    # Ready whatever Redis's version: an old one is a warning (redis-version, below), never a stop.
    version = lines.pop("redis-version")
    assert version[0] == ("warn" if lua_fix_missing(_server_version()) else "ok"), version
    assert all(label == "ok" for label, _ in lines.values()), run.stdout
    assert run.stdout.splitlines()[-1] == "ready"
    assert "migrations at head (" in lines["database"][1]
    assert "a master, maxmemory-policy noeviction" in lines["redis"][1]
    assert "the sandbox's test key" in lines["provider"][1]
    assert lines["tracing"][1] == "off (no OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT set)"
    assert f"for {TARGET}, enabled, sends all {len(EVENT_TYPES)} events; signing secret stored" in lines["webhook"][1]
    if is_postgres:
        assert "PostgreSQL allows" in lines["pools"][1]
        assert "this machine's clock is" in lines["clock"][1]
    else:
        assert lines["clock"][1] == "skipped: SQLite shares this machine's clock"


def test_json_gives_ok_and_every_check_with_its_status_and_detail(make_fresh_app, sandbox):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET=None)
    register(app)

    result = app.test_cli_runner().invoke(args=["shop", "check", "--json"])

    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report) == {"ok", "checks"} and report["ok"] is True
    assert [c["name"] for c in report["checks"]] == NAMES
    for c in report["checks"]:
        assert set(c) == {"name", "status", "detail"} and c["detail"]
        assert c["status"] == "ok" or (c["name"] == "redis-version" and lua_fix_missing(_server_version()))

    # Not ready: ok is false, and the check that failed says so.
    unready = make_fresh_app(STRIPE_API_BASE=UNREACHABLE_PROVIDER)
    result = unready.test_cli_runner().invoke(args=["shop", "check", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] is False and statuses["provider"] == "fail" and statuses["database"] == "ok"


# -- settings ------------------------------------------------------------------------------


def test_a_bad_setting_fails_the_settings_check_and_skips_the_rest(make_fresh_app):
    env = process_env(make_fresh_app(), WEB_THREADS="0")
    command = flask_command() + ["--app", "app", "shop", "check"]

    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    assert run.returncode == 1, run.stdout + run.stderr
    lines = _lines(run.stdout)
    assert list(lines) == NAMES
    assert lines["settings"] == ("FAIL", "WEB_THREADS: must be between 1 and 256, got 0 (docs/REFERENCE.md, Settings)")
    assert all(detail == "skipped: the settings did not load" for _, detail in list(lines.values())[1:])
    assert "configuration error" not in run.stderr  # the report, not the start-up line

    run = subprocess.run(command + ["--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert report["ok"] is False and report["checks"][0]["name"] == "settings"
    assert {c["status"] for c in report["checks"]} == {"fail"}


def test_real_mail_from_the_demos_sender_is_a_warning_naming_mail_from_and_a_bad_one_fails(make_fresh_app, sandbox):
    demo_sender = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, SMTP_URL="smtp://127.0.0.1:2525")
    _code, lines, output = check(demo_sender)
    label, detail = lines["settings"]
    assert label == "warn", output
    assert "MAIL_FROM is the demo's Backstop shop <shop@localhost> while SMTP_URL sends real mail" in detail

    # The same sender writing files (no SMTP_URL), or real mail from a real sender: nothing to say.
    for env in ({}, {"SMTP_URL": "smtp://127.0.0.1:2525", "MAIL_FROM": "Shop <orders@shop.example>"}):
        _code, lines, output = check(make_fresh_app(STRIPE_API_BASE=sandbox.base_url, **env))
        assert "MAIL_FROM" not in lines["settings"][1], output

    env = process_env(make_fresh_app(), MAIL_FROM="orders at shop.example")
    run = subprocess.run(
        flask_command() + ["--app", "app", "shop", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    label, detail = _lines(run.stdout)["settings"]
    assert label == "FAIL" and detail.startswith("MAIL_FROM: must be one email address"), run.stdout


# -- the database --------------------------------------------------------------------------


def test_an_unmigrated_database_fails_naming_flask_db_upgrade(make_fresh_app, sandbox, unmigrated_database_url):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, DATABASE_URL=unmigrated_database_url)

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["database"]
    assert label == "FAIL" and "no migration applied" in detail and "run `flask db upgrade`" in detail


def _one_behind_head(app) -> tuple[str, str]:
    """(the revision just below the head of `migrations/`, the head), read from the scripts, so
    the test still means "one behind" when migrations are added."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", app.extensions["migrate"].directory)
    scripts = ScriptDirectory.from_config(config)
    head = scripts.get_current_head()
    below = scripts.get_revision(head).down_revision
    return (below if isinstance(below, str) else sorted(below)[0]), head


def test_a_database_behind_head_fails_naming_flask_db_upgrade(make_fresh_app, sandbox, unmigrated_database_url):
    """A node deployed before `flask db upgrade` ran: its database has the previous release's
    migrations, not this one's last."""
    from flask_migrate import upgrade

    from shop.extensions import db

    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, DATABASE_URL=unmigrated_database_url)
    older, head = _one_behind_head(app)
    with app.app_context():
        upgrade(revision=older)
        db.engine.dispose()

    code, lines, output = check(app)

    assert code == 1, output
    assert lines["database"] == (
        "FAIL",
        f"reachable ({_where(unmigrated_database_url)}), at {older}, behind the head {head}: run `flask db upgrade`",
    )
    assert "database" in output.splitlines()[-1]  # "not ready: fix database, ..."

    # The remedy it names is the remedy: upgraded to head, the same database passes.
    with app.app_context():
        upgrade()
        db.engine.dispose()
    code, lines, output = check(app)
    assert lines["database"][0] == "ok" and f"migrations at head ({head})" in lines["database"][1], output


def _where(url: str) -> str:
    """How the database line names a database (SQLite's file, PostgreSQL's host:port/name)."""
    parsed = make_url(url)
    if url.startswith("sqlite"):
        return f"SQLite {parsed.database}"
    return f"PostgreSQL {parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database}"


def test_an_unreachable_database_fails_and_the_checks_that_need_it_say_skipped(make_fresh_app, sandbox):
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url, DATABASE_URL="postgresql+psycopg://nobody@127.0.0.1:9/nothing"
    )
    register_app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    register(register_app)  # an endpoint for this URL exists: only its secret, in the database, is unknown

    code, lines, output = check(app)

    assert code == 1, output
    assert lines["database"][0] == "FAIL" and "not reachable within 3 s" in lines["database"][1]
    for name in ("clock", "pools"):
        assert lines[name] == ("FAIL", "skipped: the database is not reachable (see database)")
    assert lines["webhook"][0] == "FAIL" and lines["webhook"][1].startswith("skipped: its signing secret is kept")
    assert lines["redis"][0] == lines["provider"][0] == "ok"
    assert "Traceback" not in output


def test_the_web_pools_above_max_connections_fail(make_fresh_app, sandbox, is_postgres):
    if not is_postgres:
        pytest.skip("SQLite has no connection limit (the pools line says so: see the ready test)")
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    with app.app_context():
        from shop.extensions import db

        allowed = int(db.session.execute(text("SHOW max_connections")).scalar())
        db.session.remove()
    concurrency = allowed // 42 + 1  # each process may open a pool of 32 + 10 (WEB_THREADS 32)
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, WEB_CONCURRENCY=concurrency)

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["pools"]
    assert label == "FAIL"
    assert f"the web may open {concurrency * 42} connections (WEB_CONCURRENCY {concurrency}" in detail
    assert f"PostgreSQL allows {allowed} (max_connections)" in detail and "Lower WEB_THREADS" in detail


def test_a_clock_off_by_more_than_two_seconds_fails(make_fresh_app, sandbox, is_postgres):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)

    with app.app_context():
        behind = {c.name: c for c in preflight.run_checks(clock=lambda: time.time() - 5)}
        close = {c.name: c for c in preflight.run_checks(clock=lambda: time.time() + 0.5)}

    if not is_postgres:
        assert behind["clock"].status == "ok" and behind["clock"].detail.startswith("skipped: SQLite")
        return
    assert behind["clock"].status == "fail"
    assert "clock is 5.0 s behind the database's (at most 2 s)" in behind["clock"].detail
    assert "NTP" in behind["clock"].detail
    assert close["clock"].status == "ok" and "0.5 s ahead of the database's" in close["clock"].detail


def test_judging_the_clock_allows_two_seconds_plus_half_the_round_trip():
    assert database_checks.judge_clock(1.9, 0.01).status == "ok"
    assert database_checks.judge_clock(-2.2, 0.01).status == "fail"
    assert database_checks.judge_clock(-2.2, 1.0).status == "ok"  # the measure itself is that uncertain


# -- Redis ---------------------------------------------------------------------------------


def test_a_redis_that_evicts_fails_naming_noeviction(make_fresh_app, sandbox, redis_servers):
    port = redis_servers("--maxmemory-policy", "allkeys-lru")
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, REDIS_URL=f"redis://127.0.0.1:{port}/0")

    code, lines, output = check(app)

    assert code == 1, output
    assert lines["redis"] == (
        "FAIL",
        f"127.0.0.1:{port}: maxmemory-policy is allkeys-lru; RQ needs noeviction, or a full Redis drops queued "
        "jobs and registries without a word (CONFIG SET maxmemory-policy noeviction, and in redis.conf)",
    )
    assert f"FAIL  redis: 127.0.0.1:{port}: maxmemory-policy is allkeys-lru; RQ needs noeviction" in output


def test_a_redis_replica_fails_naming_the_master(make_fresh_app, sandbox, redis_servers):
    master = redis_servers()
    replica = redis_servers("--replicaof", "127.0.0.1", str(master))
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, REDIS_URL=f"redis://127.0.0.1:{replica}/0")

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["redis"]
    assert label == "FAIL" and f"is a replica (of 127.0.0.1:{master}), read-only" in detail and "master" in detail


def test_a_redis_that_does_not_answer_fails(make_fresh_app, sandbox):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")

    code, lines, output = check(app)

    assert code == 1, output
    assert lines["redis"][0] == "FAIL" and "not reachable within 3 s" in lines["redis"][1]
    assert lines["database"][0] == "ok"  # the others still ran


def test_a_remote_redis_without_a_password_is_a_warning_and_a_dead_one_does_not_hang_the_check(
    make_fresh_app, sandbox, monkeypatch
):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, REDIS_URL="redis://192.0.2.1:6379/0")  # TEST-NET-1
    clients = []

    def client_made(url, **options):
        made = preflight_redis_client(url, **options)
        clients.append(made)
        return made

    monkeypatch.setattr(preflight, "redis_client", client_made)
    code, lines, output = check(app)

    # A Redis that does not answer holds the check up no longer than the timeouts its client was
    # given: the system's connect timeout, minutes against an address that drops the packets, never.
    given = [
        (
            c.connection_pool.connection_kwargs.get("socket_connect_timeout"),
            c.connection_pool.connection_kwargs.get("socket_timeout"),
        )
        for c in clients
    ]
    assert given and set(given) == {(preflight.TIMEOUT_SECONDS, preflight.TIMEOUT_SECONDS)}, given
    assert code == 1, output
    assert lines["redis"][0] == "FAIL"
    label, detail = lines["redis-auth"]
    assert label == "warn" and detail.startswith("REDIS_URL reaches Redis at 192.0.2.1:6379, not on this machine")


def _server_version() -> str:
    with Redis.from_url(redis_url()) as conn:
        return conn.info("server")["redis_version"]


@pytest.mark.parametrize(
    ("version", "fixed"),
    [
        ("6.2.19", False),
        ("6.2.20", True),
        ("7.0.15", False),  # a line that never had a fixed release
        ("7.2.10", False),
        ("7.2.11", True),
        ("7.4.5", False),
        ("7.4.6", True),
        ("8.0.3", False),
        ("8.0.4", True),
        ("8.2.1", False),
        ("8.2.2", True),
        ("8.4.0", True),  # released after the fixes
        ("5.0.14", False),
    ],
)
def test_the_lua_fix_rule_is_the_minimum_patch_release_of_each_line(version, fixed):
    assert (lua_fix_missing(version) is None) is fixed


def test_a_redis_without_the_lua_fixes_is_a_warning_naming_the_releases_that_have_them(make_fresh_app, sandbox):
    """This machine's Redis, asked for its version as the check asks it: an old one (7.0.15 here,
    a line that never got the fixes) warns, in words, with the release of each line to upgrade to."""
    version = _server_version()
    if lua_fix_missing(version) is None:
        pytest.skip(f"this machine's Redis {version} has the fixes; the rule's own test covers the warning")
    code, lines, output = check(make_fresh_app(STRIPE_API_BASE=sandbox.base_url))
    label, detail = lines["redis-version"]
    assert label == "warn", output
    assert detail.startswith(f"Redis {version} at ") and "CVE-2025-49844" in detail
    assert "6.2.20, 7.2.11, 7.4.6, 8.0.4 or 8.2.2" in detail
    assert lines["redis"][0] == "ok"  # a warning beside a reachable master, not a failure of it


# -- the provider and the webhook ---------------------------------------------------------


def test_a_provider_that_does_not_answer_fails_and_skips_the_webhook(make_fresh_app):
    app = make_fresh_app(STRIPE_API_BASE=UNREACHABLE_PROVIDER)

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["provider"]
    assert label == "FAIL" and f"the provider at {UNREACHABLE_PROVIDER} did not answer within 5 s" in detail
    assert lines["webhook"] == ("FAIL", "skipped: the provider did not answer the key (see provider)")


def test_a_key_the_provider_refuses_fails(make_fresh_app, sandbox):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SECRET_KEY="sk_nonsense_key")
    app_pk = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SECRET_KEY="pk_test_abc")

    _, lines, _ = check(app)  # the sandbox takes any sk_ key: this one starts sk_ but is no mode of Stripe's
    code, lines_pk, output = check(app_pk)

    assert lines["provider"][0] == "warn" and "does not start like a Stripe secret key" in lines["provider"][1]
    assert code == 1, output
    assert lines_pk["provider"][0] == "FAIL" and "is a publishable key" in lines_pk["provider"][1]

    refused = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SECRET_KEY="xk_live_unknown")
    code, lines, output = check(refused)
    assert code == 1
    assert lines["provider"][0] == "FAIL" and "refused it (401: Invalid API Key provided" in lines["provider"][1]


def test_a_live_key_sent_to_the_sandbox_and_a_test_key_on_a_public_shop_are_warnings(make_fresh_app, sandbox):
    live = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SECRET_KEY="sk_live_abc")
    public = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, PUBLIC_BASE_URL="https://shop.example.com")

    _, live_lines, _ = check(live)
    _, public_lines, _ = check(public)

    assert live_lines["provider"][0] == "warn"
    assert "live key (sk_live_...)" in live_lines["provider"][1]
    assert f"a live key sent to STRIPE_API_BASE {sandbox.base_url}" in live_lines["provider"][1]
    assert public_lines["provider"][0] == "warn"
    assert "a test-mode key for a public shop (https://shop.example.com)" in public_lines["provider"][1]


def test_no_endpoint_registered_fails_naming_the_command(make_fresh_app, sandbox):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)

    code, lines, output = check(app)

    assert code == 1, output
    assert lines["webhook"] == (
        "FAIL",
        f"the provider has no endpoint for {TARGET}: no payment would be confirmed by its webhook (check "
        "PUBLIC_BASE_URL, then run `flask shop stripe-register-webhook`)",
    )
    assert output.splitlines()[-1] == "not ready: fix webhook"


def test_an_endpoint_for_another_url_fails_naming_it(make_fresh_app, sandbox):
    register(make_fresh_app(STRIPE_API_BASE=sandbox.base_url, PUBLIC_BASE_URL="https://old.example.com"))
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["webhook"]
    assert label == "FAIL"
    assert detail.startswith(
        f"the provider has no endpoint for {TARGET}; it has 1 for other URLs (https://old.example.com/webhooks/stripe)"
    )


def test_an_endpoint_short_of_events_fails_naming_them(make_fresh_app, sandbox):
    endpoint(sandbox, TARGET, ["checkout.session.completed", "checkout.session.expired"])
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET="whsec_from_the_dashboard")

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["webhook"]
    assert label == "FAIL"
    assert "does not send checkout.session.async_payment_succeeded, checkout.session.async_payment_failed, " in detail
    assert "refund.updated, refund.failed" in detail and "stripe-register-webhook" in detail


def test_an_endpoint_whose_signing_secret_is_held_nowhere_fails(make_fresh_app, sandbox):
    endpoint(sandbox, TARGET, list(EVENT_TYPES))
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET=None)

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["webhook"]
    assert label == "FAIL" and "but no signing secret" in detail and "every delivery would be refused" in detail

    # With the secret configured (a person created the endpoint and copied its secret), it passes.
    configured = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET="whsec_copied")
    code, lines, output = check(configured)
    assert code == 0, output
    assert lines["webhook"][0] == "ok" and lines["webhook"][1].endswith("signing secret from STRIPE_WEBHOOK_SECRET")


def test_an_endpoint_rendering_another_api_version_fails_naming_both_versions(make_fresh_app, sandbox):
    """A person's endpoint made while the account's default was an older version renders events
    in it, whatever the SDK reads (docs/REFERENCE.md, flask shop check)."""
    sandbox.account(default_api_version="2025-03-31.basil")
    endpoint(sandbox, TARGET, list(EVENT_TYPES))
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET="whsec_copied")

    code, lines, output = check(app)

    assert code == 1, output
    label, detail = lines["webhook"]
    assert label == "FAIL"
    assert f"renders events in API version 2025-03-31.basil, but this shop reads {stripe.api_version}" in detail
    assert f"create it again at the provider in API version {stripe.api_version}" in detail


def test_an_endpoint_registration_made_passes_on_an_account_whose_default_version_is_older(make_fresh_app, sandbox):
    sandbox.account(default_api_version="2025-03-31.basil")
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_WEBHOOK_SECRET=None)
    register(app)

    code, lines, output = check(app)

    assert code == 0, output
    assert lines["webhook"][0] == "ok"


def test_the_command_is_documented():
    with open(os.path.join(ROOT, "docs", "REFERENCE.md")) as f:
        reference = f.read()
    assert "| `flask shop check` |" in reference
    for name in NAMES:
        assert f"`{name}`" in reference
