"""`flask shop check`: the preflight a deploy runs before it switches traffic to a node
(docs/REFERENCE.md, Commands). One `Check` per thing the node needs, each saying what to fix:

- settings: they loaded (a bad value never gets this far: app.py reports it as this check's
  failure, `settings_failed`), the one the web needs besides (SECRET_KEY), and a warning for
  real mail (SMTP_URL) still sent from the demo's MAIL_FROM;
- database: reachable, and its migrations at the head of `migrations/`;
- redis: reachable, a master, `maxmemory-policy noeviction` (RQ's requirement: an evicted job
  or registry is work lost without a word); redis-auth: the start-up warning about a remote
  Redis without a password; redis-version: one without the fixes of its known Lua flaws
  (redis_version.py);
- provider: the key's mode (live/test, from its prefix) and that the provider answers it;
- webhook: an enabled endpoint at the provider for PUBLIC_BASE_URL + /webhooks/stripe sending
  every event the shop uses, and its signing secret held;
- clock: this machine's clock within CLOCK_TOLERANCE_SECONDS of the database's;
- pools: what the web's pools may open against PostgreSQL's max_connections (or PgBouncer's
  max_client_conn), the comparison every process makes when it first connects;
- tracing: whether spans are on and where they are exported (OTEL_*; a warning when the variables
  ask for them and the `otel` extra is not installed), never a failure.

Every service is asked with a short timeout, so a dead one fails its line instead of hanging the
deploy; a check that needs one that failed says "skipped" and why, never a traceback. The database,
clock and pools lines are database_checks.py's; a line (`Check`) is checks.py's.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from urllib.parse import urlsplit

from flask import current_app

from .. import traces
from ..provider import gateway, probe
from ..provider.registration import ENDPOINT_KEY, webhook_secret
from ..public_urls import public_url_for
from ..redis_client import redis_client, unprotected_redis_hosts, unprotected_redis_words
from ..settings_values import DEFAULT_MAIL_FROM, parse_sentinel_url
from .checks import FAIL, LABELS, OK, PROVIDER_TIMEOUT_SECONDS, TIMEOUT_SECONDS, WARN, Check, first_line
from .database_checks import DatabaseChecks
from .redis_version import redis_version_check

NAMES = (
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
)
REGISTER = "run `flask shop stripe-register-webhook`"


def ready(checks: list[Check]) -> bool:
    return all(c.status != FAIL for c in checks)


def render_text(checks: list[Check]) -> str:
    lines = [f"{LABELS[c.status]:<6}{c.name}: {c.detail}" for c in checks]
    failed = [c.name for c in checks if c.status == FAIL]
    lines.append(f"not ready: fix {', '.join(failed)}" if failed else "ready")
    return "\n".join(lines)


def render_json(checks: list[Check]) -> str:
    return json.dumps({"ok": ready(checks), "checks": [asdict(c) for c in checks]}, indent=2)


def settings_failed(error: Exception) -> list[Check]:
    """The report when the settings did not load (app.py calls this instead of building the app):
    nothing else can be asked without them."""
    return [Check("settings", FAIL, f"{error} (docs/REFERENCE.md, Settings)")] + [
        Check(name, FAIL, "skipped: the settings did not load") for name in NAMES[1:]
    ]


def run_checks(clock=time.time) -> list[Check]:
    """Every check, in order, inside the app context. `clock` is this machine's clock (the test's
    seam: a database's clock cannot be set, so the test moves this one)."""
    checks = [_settings()]
    database = DatabaseChecks()
    checks.append(database.check())
    checks += _redis()
    provider, endpoints = _provider()
    checks += [provider, _webhook(endpoints, database), database.clock(clock), database.pools()]
    database.close()
    warning, tracing = traces.describe(os.environ)
    checks.append(Check("tracing", WARN if warning else OK, tracing))
    # One line each, whatever a driver's or the SDK's message held.
    return [Check(c.name, c.status, " ".join(c.detail.split())) for c in checks]


# -- settings ---------------------------------------------------------------------------------


def _settings() -> Check:
    settings = current_app.config["SETTINGS"]
    detail = f"loaded; node {settings.node_name}, PUBLIC_BASE_URL {settings.public_base_url}"
    warnings = []
    if settings.secret_key_ephemeral:
        warnings.append(
            "SECRET_KEY is unset: the worker and the scheduler run without it, the web refuses to "
            "start (set the same SECRET_KEY for every web process)"
        )
    if settings.smtp_url and settings.mail_from == DEFAULT_MAIL_FROM:
        warnings.append(
            f"MAIL_FROM is the demo's {DEFAULT_MAIL_FROM} while SMTP_URL sends real mail: set MAIL_FROM to an "
            "address of your domain (customers see it, and mail servers refuse or bin mail from localhost)"
        )
    if warnings:
        return Check("settings", WARN, "; ".join([detail, *warnings]))
    return Check("settings", OK, detail)


# -- Redis --------------------------------------------------------------------------------------


def _redis_where(url: str) -> str:
    if url.startswith("redis+sentinel://"):
        where = parse_sentinel_url(url)
        sentinels = ",".join(f"{host}:{port}" for host, port in where.sentinels)
        return f"the master of {where.service} (Sentinels {sentinels})"
    parts = urlsplit(url)
    return parts.path if parts.scheme == "unix" else parts.netloc.rpartition("@")[2] or "127.0.0.1:6379"


def _redis() -> list[Check]:
    from redis.exceptions import RedisError, ResponseError

    url = current_app.config["REDIS_URL"]
    where = _redis_where(url)
    hosts = unprotected_redis_hosts(url)
    auth = (
        Check("redis-auth", WARN, unprotected_redis_words(hosts))
        if hosts
        else Check("redis-auth", OK, "a password in REDIS_URL, TLS or a socket, or Redis on this machine")
    )
    found = [auth]  # beside the server's own check; its version's once it answers
    client = redis_client(
        url, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS, decode_responses=True
    )
    try:
        client.ping()
        found.append(redis_version_check(client.info("server").get("redis_version"), where))
        replication = client.info("replication")
        role = replication.get("role")
        if role != "master":
            role = "replica" if role == "slave" else role  # Redis's own word in INFO
            master = f"{replication.get('master_host')}:{replication.get('master_port')}"
            return [
                Check(
                    "redis",
                    FAIL,
                    f"{where} is a {role} (of {master}), read-only: point REDIS_URL at the master, or at "
                    "its Sentinels (redis+sentinel://) to follow a failover",
                ),
                *found,
            ]
        try:
            policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
        except ResponseError as error:  # CONFIG renamed or disabled (managed Redis)
            return [
                Check(
                    "redis",
                    WARN,
                    f"reachable at {where}, a master; its maxmemory-policy could not be read ({first_line(error)}): "
                    "RQ needs noeviction, make sure it is set",
                ),
                *found,
            ]
    except RedisError as error:
        if len(found) == 1:
            found.append(Check("redis-version", WARN, "skipped: Redis did not answer (see redis)"))
        return [
            Check(
                "redis",
                FAIL,
                f"{where} not reachable within {TIMEOUT_SECONDS:g} s: {first_line(error)} (check REDIS_URL, the "
                "server, and the network between them)",
            ),
            *found,
        ]
    finally:
        client.close()
    if policy != "noeviction":
        return [
            Check(
                "redis",
                FAIL,
                f"{where}: maxmemory-policy is {policy}; RQ needs noeviction, or a full Redis drops queued jobs "
                "and registries without a word (CONFIG SET maxmemory-policy noeviction, and in redis.conf)",
            ),
            *found,
        ]
    return [Check("redis", OK, f"reachable at {where}, a master, maxmemory-policy noeviction"), *found]


# -- the provider and the webhook -------------------------------------------------------------

LIVE, TEST = "live", "test"


def key_mode(key: str | None) -> str | None:
    """live or test from a Stripe secret or restricted key's prefix; None for anything else."""
    for prefix, mode in (("sk_live_", LIVE), ("rk_live_", LIVE), ("sk_test_", TEST), ("rk_test_", TEST)):
        if (key or "").startswith(prefix):
            return mode
    return None


def _local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "127.0.0.1", "::1") or host.endswith(".localhost")


def _provider() -> tuple[Check, list | None]:
    cfg = current_app.config
    key = cfg.get("STRIPE_SECRET_KEY")
    base = gateway.api_base()
    at = f"the provider at {base}" if base else "Stripe"
    if key is None:
        mode, what = TEST, "the sandbox's test key (no STRIPE_SECRET_KEY)"
    elif key.startswith("pk_"):
        return (
            Check(
                "provider",
                FAIL,
                "STRIPE_SECRET_KEY is a publishable key (pk_...): the shop needs the account's secret key "
                "(sk_live_... / sk_test_...) or a restricted key (rk_...)",
            ),
            None,
        )
    else:
        mode = key_mode(key)
        what = f"{mode} key ({key[:8]}...)" if mode else f"a key starting {key[:3]!r}"
    try:
        endpoints = probe.list_webhook_endpoints_once(PROVIDER_TIMEOUT_SECONDS)
    except gateway.ProviderRefused as error:
        return Check("provider", FAIL, f"{what}: {at} refused it ({error}): check STRIPE_SECRET_KEY"), None
    except gateway.ProviderUnavailable as error:
        return (
            Check(
                "provider",
                FAIL,
                f"{what}: {at} did not answer within {PROVIDER_TIMEOUT_SECONDS:g} s ({error}): check "
                "STRIPE_API_BASE and the network",
            ),
            None,
        )
    warnings = []
    if mode is None:
        warnings.append("it does not start like a Stripe secret key (sk_live_, sk_test_, rk_live_, rk_test_)")
    if mode == LIVE and base:
        warnings.append(f"a live key sent to STRIPE_API_BASE {base}, not to Stripe: unset STRIPE_API_BASE")
    public = cfg["PUBLIC_BASE_URL"]
    if mode == TEST and public.startswith("https://") and not _local(public):
        warnings.append(
            f"a test-mode key for a public shop ({public}): no real money is taken; set the live key before "
            "taking orders"
        )
    detail = f"{what}; {at} answered ({len(endpoints)} webhook endpoint{'s' if len(endpoints) != 1 else ''})"
    return Check("provider", WARN if warnings else OK, "; ".join([detail, *warnings])), endpoints


def _webhook(endpoints: list | None, database: DatabaseChecks) -> Check:
    if endpoints is None:
        return Check("webhook", FAIL, "skipped: the provider did not answer the key (see provider)")
    target = public_url_for("webhooks.stripe_webhook")
    mine = [ep for ep in endpoints if ep.url == target]
    if not mine:
        others = sorted({ep.url for ep in endpoints if ep.url})
        elsewhere = f"; it has {len(others)} for other URLs ({', '.join(others[:3])})" if others else ""
        return Check(
            "webhook",
            FAIL,
            f"the provider has no endpoint for {target}{elsewhere}: no payment would be confirmed by its "
            f"webhook (check PUBLIC_BASE_URL, then {REGISTER})",
        )
    enabled = [ep for ep in mine if ep.status == gateway.EndpointStatus.ENABLED]
    if not enabled:
        return Check("webhook", FAIL, f"the endpoint for {target} ({mine[0].id}) is disabled: {REGISTER}")

    def missing(ep) -> list[str]:
        return [] if "*" in ep.enabled_events else [e for e in gateway.EVENT_TYPES if e not in ep.enabled_events]

    complete = [ep for ep in enabled if not missing(ep)]
    if not complete:
        ep = enabled[0]
        return Check(
            "webhook", FAIL, f"endpoint {ep.id} for {target} does not send {', '.join(missing(ep))}: {REGISTER}"
        )
    warnings = []
    if len(enabled) > 1:
        warnings.append(
            f"{len(enabled)} enabled endpoints for this URL ({', '.join(ep.id for ep in enabled)}): every event is "
            "sent to each, and only one's signing secret verifies: delete the others at the provider"
        )
    found = _signing_secret(complete, target, database, warnings)
    if isinstance(found, Check):
        return found
    held, source = found
    if held[0].api_version != gateway.SDK_API_VERSION:
        return Check(
            "webhook", FAIL, _version_problem(held[0], target, bool(current_app.config.get("STRIPE_WEBHOOK_SECRET")))
        )
    detail = (
        f"endpoint {held[0].id} for {target}, enabled, sends all {len(gateway.EVENT_TYPES)} events; "
        f"signing secret {source}"
    )
    return Check("webhook", WARN if warnings else OK, "; ".join([detail, *warnings]))


def _version_problem(endpoint, target: str, configured: bool) -> str:
    """Our endpoint renders its events in another API version than the SDK reads. `configured`:
    its secret is STRIPE_WEBHOOK_SECRET, so a person manages the endpoint, not registration."""
    rendered = f"API version {endpoint.api_version}" if endpoint.api_version else "the account's default API version"
    remedy = (
        f"create it again at the provider in API version {gateway.SDK_API_VERSION} and set STRIPE_WEBHOOK_SECRET "
        "to the new endpoint's secret"
        if configured
        else f"{REGISTER} (it replaces the endpoint)"
    )
    return (
        f"endpoint {endpoint.id} for {target} renders events in {rendered}, but this shop reads "
        f"{gateway.SDK_API_VERSION} (its SDK's): {remedy}"
    )


def _signing_secret(complete: list, target: str, database: DatabaseChecks, warnings: list) -> Check | tuple[list, str]:
    """Which of the complete endpoints' signing secret the shop holds, and where it comes from; or
    the check's failure when it holds none of them."""
    configured = current_app.config.get("STRIPE_WEBHOOK_SECRET")
    if configured:
        held, source = complete, "from STRIPE_WEBHOOK_SECRET"
        if not configured.startswith("whsec_"):
            warnings.append("STRIPE_WEBHOOK_SECRET does not start with whsec_: is it the endpoint's signing secret?")
    elif database.problem:
        why = f"skipped: its signing secret is kept in the database, and {database.problem} (see database)"
        return Check("webhook", FAIL, why)
    else:
        from ..extensions import db
        from ..models import KeyValue

        try:
            secret = webhook_secret()
            stored = db.session.get(KeyValue, ENDPOINT_KEY)
            stored_id = stored.value if stored else None
        finally:
            db.session.remove()
        if not secret:
            return Check(
                "webhook",
                FAIL,
                f"endpoint {complete[0].id} for {target}, but no signing secret: neither STRIPE_WEBHOOK_SECRET nor "
                f"one stored by registration, so every delivery would be refused: {REGISTER} (or set "
                "STRIPE_WEBHOOK_SECRET)",
            )
        held = [ep for ep in complete if ep.id == stored_id]
        if not held:
            return Check(
                "webhook",
                FAIL,
                f"the signing secret stored belongs to endpoint {stored_id}, not to {complete[0].id} for {target}: "
                f"every delivery would be refused: {REGISTER}",
            )
        source = "stored in the database"
    return held, source
