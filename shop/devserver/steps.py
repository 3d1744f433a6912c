"""The steps of `flask shop up` between the plan and the watch: the database migrated and seeded
with an operator, the Stripe sandbox started and the webhook registered with it, the web, worker
and scheduler started, and the banner that says where everything is."""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import sys
import warnings

from flask_migrate import upgrade

from ..extensions import db
from ..provider.gateway import ProviderRefused, ProviderUnavailable
from ..provider.registration import register_webhook as register
from ..seed import create_operator_if_missing, seed_catalog
from ..settings import DEFAULT_WEB_CONCURRENCY, DEFAULT_WEB_THREADS
from ..settings_values import parse_trusted_proxies
from . import front
from .plan import OPERATOR_EMAIL, SANDBOX_PORT, SANDBOX_STATE_FILE, Plan, shown_redis_url, shown_url
from .supervise import LOCAL, Child, Console, Supervisor, UpError, ellipsis, http_status


class _Migrations(logging.Filter):
    """Alembic's lines while `up` migrates, kept instead of printed: one line per migration (23 on
    a first run) says less than the summary `up` prints from them."""

    def __init__(self):
        super().__init__()
        self.applied: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Running upgrade"):
            self.applied.append(message.split("->", 1)[-1].split(",", 1)[0].strip())
        return False


def _migrate(console: Console) -> None:
    """The migrations applied, said in one line, and the libraries' warnings meanwhile in one more."""
    kept = _Migrations()
    migration_log = logging.getLogger("alembic.runtime.migration")
    migration_log.addFilter(kept)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            upgrade()
    except Exception as exc:  # noqa: BLE001 - any failure here is reported as one line
        raise UpError(f"could not apply the migrations: {_first_line(exc)}") from None
    finally:
        migration_log.removeFilter(kept)
    if kept.applied:
        console.line(f"    applied {len(kept.applied)} migrations, now at {kept.applied[-1]}")
    else:
        console.line("    already up to date")
    if caught:
        first = caught[0]
        more = f" (and {len(caught) - 1} more)" if len(caught) > 1 else ""
        console.line(f"    library warnings: {first.category.__name__}: {first.message}{more}")


def prepare_database(plan: Plan, app, console: Console) -> None:

    dots = ellipsis()
    with app.app_context():
        console.step(f"Applying migrations to {shown_url(plan.env['DATABASE_URL'])}{dots}")
        _migrate(console)

        console.step(f"Seeding the demo catalog{dots}")
        created = seed_catalog()
        if created["variants"]:
            console.line(f"    added {created['products']} products and {created['variants']} variants")
        else:
            console.line("    already there")
        password = secrets.token_urlsafe(9)
        if create_operator_if_missing(OPERATOR_EMAIL, password):
            plan.password = password
            console.step(
                f"Operator {OPERATOR_EMAIL} created: log in at {plan.base_url}/console/login "
                f"with password {password} (kept across restarts)"
            )
        else:
            console.step(
                f"Operator {OPERATOR_EMAIL} exists; its password is the one printed when it was "
                f"created (reset it with `flask shop create-operator {OPERATOR_EMAIL}`)"
            )
        db.session.remove()
        db.engine.dispose()


def start_sandbox(plan: Plan, sup: Supervisor, console: Console) -> Child:
    port = plan.start_sandbox_on
    note = "" if port == SANDBOX_PORT else f" ({SANDBOX_PORT} is taken)"
    console.step(f"Starting the Stripe sandbox on port {port}{note}{ellipsis()}")
    # The shop's own session minimum goes to its sandbox: a shop that asks for shorter
    # sessions than its provider accepts has every checkout refused.
    state_file = os.path.join(plan.env["BACKSTOP_INSTANCE_PATH"], SANDBOX_STATE_FILE)
    listener = plan.sandbox_socket
    assert listener is not None, "make_plan binds the sandbox's socket whenever it plans to start one"
    try:
        return sup.start(
            "sandbox",
            [
                sys.executable,
                "-m",
                "shop.stripe_sandbox",
                "--host",
                LOCAL,
                "--port",
                str(port),
                "--fd",
                str(listener.fileno()),
                "--min-session-seconds",
                str(plan.session_min_seconds),
                "--state-file",
                state_file,
            ],
            plan.env,
            plan.root,
            role="service",
            pass_fds=(listener.fileno(),),
        )
    finally:
        listener.close()  # the sandbox holds it now
        plan.sandbox_socket = None


def register_webhook(plan: Plan, app, console: Console) -> None:

    console.step(f"Registering {plan.env['PUBLIC_BASE_URL']}/webhooks/stripe with the sandbox{ellipsis()}")
    assert plan.sandbox_url is not None, "`up` registers the webhook only when it has a sandbox URL"
    if http_status(plan.sandbox_url + "/_sandbox/faults") is None:
        raise UpError(f"no Stripe sandbox answers at STRIPE_API_BASE={plan.sandbox_url}")
    with app.app_context():
        try:
            for line in register():
                console.line(f"    {line}")
        except (ProviderUnavailable, ProviderRefused) as exc:
            raise UpError(f"could not register the webhook: {exc}") from None
        finally:
            db.session.remove()
            db.engine.dispose()


def start_processes(plan: Plan, sup: Supervisor, console: Console) -> None:
    flask = [sys.executable, "-m", "flask", "--app", "app"]
    if importlib.util.find_spec("gunicorn") is not None:
        _start_gunicorn(plan, sup, console)
    else:
        web = flask + [
            "run",
            "--host",
            LOCAL,
            "--port",
            str(plan.port),
            "--no-reload",
            "--no-debugger",
            "--with-threads",
        ]
        plan.web_how = "flask run (gunicorn is not installed)"
        console.step(f"Starting web (flask run, since gunicorn is not installed), worker and scheduler{ellipsis()}")
        sup.start("web", web, plan.env, plan.root, role="app")
    sup.start("worker", flask + ["shop", "worker"], plan.env, plan.root, role="app")
    sup.start("scheduler", flask + ["shop", "scheduler"], plan.env, plan.root, role="app")


def _start_gunicorn(plan: Plan, sup: Supervisor, console: Console) -> None:
    """gunicorn's threaded workers, sized like the Procfile's web line (create_app has validated
    both), behind the Procfile's front (front.py) when nginx is installed: nginx on the port the
    user opens, gunicorn on a loopback port of its own. Without nginx gunicorn takes the port
    itself, with a warning: the demo must run with nothing installed."""
    # --preload: the app is imported once in the master and forked, not once per worker
    # (create_app opens no connection, so nothing is shared across the fork).
    extra = [
        "--preload",
        "--graceful-timeout",
        "5",
        "--access-logfile",
        "-",
        "--access-logformat",
        "%(m)s %(U)s%(q)s -> %(s)s in %(M)sms",  # %(q)s: "?" and the query, its token hidden
        "--logger-class",
        "shop.devserver.access_log.AccessLog",
    ]
    if _gunicorn_has_flag("--no-control-socket"):
        # gunicorn >= 25 opens ~/.gunicorn/gunicorn.ctl by default: two demos would share it.
        extra.append("--no-control-socket")
    workers = plan.env.get("WEB_CONCURRENCY") or str(DEFAULT_WEB_CONCURRENCY)
    threads = plan.env.get("WEB_THREADS") or str(DEFAULT_WEB_THREADS)
    public = f"{LOCAL}:{plan.port}"
    binary = front.nginx_binary(plan.env)
    if binary is None:
        console.step(
            f"WARNING: {front.no_nginx_words(plan.env)}: gunicorn serves {public} itself, and a slow or idle "
            "client can hold one of its threads (fine for a demo on this machine; production "
            "runs `flask shop web`, which refuses to start without nginx)"
        )
        plan.web_how = "gunicorn, threaded workers, directly (no nginx in front)"
        console.step(f"Starting web (gunicorn, threaded workers), worker and scheduler{ellipsis()}")
        sup.start("web", front.gunicorn_argv(public, workers, threads, *extra), plan.env, plan.root, role="app")
        return
    listener = front.loopback_listener()
    inner = f"{LOCAL}:{listener.getsockname()[1]}"
    try:
        trust = parse_trusted_proxies(plan.env.get("TRUSTED_PROXIES"))
        web_front = front.Front.prepare(binary, public, inner, trust)
        plan.cleanup.append(web_front.run_dir)
        plan.web_how = f"nginx on {public}, reading each request whole, in front of gunicorn on {inner}"
        console.step(f"Starting web (nginx in front of gunicorn, threaded workers), worker and scheduler{ellipsis()}")
        sup.start(
            "web",
            front.gunicorn_argv(f"fd://{listener.fileno()}", workers, threads, *extra),
            {**plan.env, "BACKSTOP_BEHIND_FRONT": "1"},
            plan.root,
            role="app",
            pass_fds=(listener.fileno(),),
        )
    except front.FrontError as exc:
        raise UpError(str(exc)) from None
    finally:
        listener.close()
    sup.start("front", web_front.argv, plan.env, plan.root, role="app")


def _gunicorn_has_flag(flag: str) -> bool:
    try:
        from gunicorn.config import KNOWN_SETTINGS
    except ImportError:
        return False
    return any(flag in (getattr(setting, "cli", None) or []) for setting in KNOWN_SETTINGS)


def banner(plan: Plan, console: Console) -> None:
    redis_note = "bundled redis-server, in memory" if plan.start_redis_on else "already running"
    if plan.start_sandbox_on:
        stripe_line = f"{plan.sandbox_url}/  (sandbox: its /pay page lets you pay, decline or pay later)"
    elif plan.sandbox_url:
        stripe_line = f"{plan.sandbox_url}/  (sandbox at STRIPE_API_BASE)"
    else:
        stripe_line = "Stripe itself (STRIPE_SECRET_KEY)"
    rows = [
        ("Storefront", f"{plan.base_url}/"),
        ("  served by", plan.web_how),
        ("Console", f"{plan.base_url}/console/"),
        (
            "  login",
            f"{OPERATOR_EMAIL} / {plan.password}"
            if plan.password
            else f"{OPERATOR_EMAIL} (password as first printed; reset: flask shop create-operator {OPERATOR_EMAIL})",
        ),
        ("Stripe", stripe_line),
        ("Redis", f"{shown_redis_url(plan.env['REDIS_URL'])}  ({redis_note})"),
        ("Database", shown_url(plan.env["DATABASE_URL"])),
        ("Mail", mail_goes(plan)),
    ]
    console.line()
    console.line("Backstop is up.", bold=True)
    for label, value in rows:
        console.line(f"  {label:<11} {value}")
    console.line("Press Ctrl-C to stop everything.")
    console.line()


def mail_goes(plan: Plan) -> str:
    """Where the shop's emails go: the mail server in SMTP_URL, or files the console lists."""
    if (plan.env.get("SMTP_URL") or "").strip():
        return "the mail server in SMTP_URL"
    folder = os.path.join(plan.env["BACKSTOP_INSTANCE_PATH"], "mail")
    return f"written to {folder}/ (SMTP_URL is unset), listed at {plan.base_url}/console/mail"


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {text[0]}" if text else type(orig).__name__
