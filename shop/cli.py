"""`flask shop ...`: the operational commands (docs/REFERENCE.md, Commands)."""

from __future__ import annotations

import logging
import sys

import click
from flask import current_app
from flask.cli import AppGroup
from sqlalchemy.exc import DBAPIError

from . import failpoints, queue
from .extensions import the_app
from .models import CycleStatus
from .outbox.relay import relay_once, wake_due_work
from .payments import checkout_queue
from .provider import watch as provider_watch
from .provider.registration import register_webhook
from .scheduling import retention, takeover
from .scheduling.sweep import run_cycle
from .seed import seed_catalog, upsert_operator

log = logging.getLogger("shop.scheduler")

shop_cli = AppGroup("shop", help="Backstop operations.")

# Where the app keeps the factory that built it, for `flask shop up` (see init_app).
_APP_FACTORY = "backstop_app_factory"


def init_app(app, *, app_factory) -> None:
    """The app factory registers these commands and hands itself in: `flask shop up` builds an app
    for the environment it plans, and the CLI, which the factory imports, never imports it back."""
    app.extensions[_APP_FACTORY] = app_factory
    app.cli.add_command(shop_cli)


@shop_cli.command("seed")
def seed_command():
    """Load the demo catalog (idempotent)."""
    created = seed_catalog()
    click.echo(f"Demo catalog ready ({created['products']} products and {created['variants']} variants added).")


@shop_cli.command("create-operator")
@click.argument("email")
@click.option("--password", help="The operator's password (prompted for when omitted).")
def create_operator_command(email, password):
    """Create or reset an operator account."""
    if "@" not in email:
        raise click.BadParameter("must be an email address", param_hint="EMAIL")
    if not password:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if len(password) < 8:
        raise click.BadParameter("must be at least 8 characters", param_hint="--password")
    created = upsert_operator(email, password)
    click.echo(f"Operator {email} {'created' if created else 'password reset'}.")


@shop_cli.command("worker")
@click.option("--burst", is_flag=True, help="Drain the queues and exit.")
def worker_command(burst):
    """Run an RQ worker on the app's queues, and beside it the payment queue (the orders in line
    for their payment page; one worker of the shop serves it at a time)."""
    queue.wait_for_redis(click.echo)
    if not burst:
        checkout_queue.start_in_background(the_app())
    queue.run_worker(burst=burst)


@shop_cli.command("scheduler")
@click.option("--burst", is_flag=True, help="Move due jobs once and exit.")
def scheduler_command(burst):
    """Run rq-scheduler: register periodic jobs, wake drains for due work, then poll (each poll
    also asks the database for due deadlines, commands and deliveries); beside it, watch the
    sweep's lease and queue a cycle when one was left behind mid-cycle, and check the payment
    provider every few seconds for the console (provider.watch)."""
    cfg = current_app.config
    sweep = (
        cfg["RECONCILIATION_INTERVAL_SECONDS"]
        if cfg["RECONCILIATION_ENABLED"] or cfg["UNPAID_ORDER_EXPIRY_ENABLED"]
        else None
    )

    def rebuild() -> list[str]:
        """Redis's part, from the database: the periodic jobs, then a drain for what is due."""
        failpoints.hit("scheduler.rebuild.register")
        periodic = queue.register_periodic_jobs(cfg["RELAY_INTERVAL_SECONDS"], sweep, cfg["PRUNE_INTERVAL_SECONDS"])
        lines = [f"periodic job {line}" for line in periodic]
        failpoints.hit("scheduler.rebuild.relay")
        counts = relay_once()
        lines.append(
            f"due in the database: {counts['deliveries']} deliveries, {counts['commands']} commands "
            "(future deadlines are found by each poll)"
        )
        return lines

    def on_loss() -> None:
        log.warning(
            "Redis lost the scheduler's jobs (restarted without persistence, flushed or evicted); "
            "rebuilding them from the database"
        )
        for line in rebuild():
            log.warning(line)

    for line in queue.once_redis_holds(rebuild, click.echo):
        click.echo(line)
    click.echo(f"scheduler polling every {cfg['SCHEDULER_POLL_SECONDS']}s")
    if sweep is not None and not burst:
        takeover.watch_in_background(the_app(), sweep)
    if not burst:
        provider_watch.watch_in_background(the_app())
    queue.run_scheduler(
        burst=burst,
        watch=queue.periodic_job_ids(sweep is not None, with_prune=True),
        on_loss=on_loss,
        on_poll=wake_due_work,
    )


@shop_cli.command("relay")
def relay_command():
    """Re-announce due deliveries and commands to Redis now."""
    click.echo(relay_once())


@shop_cli.command("sweep")
def sweep_command():
    """Run one reconciliation cycle now, in-process, and print what each pass did."""
    result = run_cycle()
    for line in result.report_lines():
        click.echo(line)
    if result.status == CycleStatus.FAILED:
        sys.exit(1)


@shop_cli.command("prune")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; change nothing.")
def prune_command(dry_run):
    """Apply the retention rules now (RETENTION_DAYS, AUDIT_RETENTION_DAYS) and print what was
    removed, or with --dry-run what would be."""
    cfg = current_app.config
    dry = " (dry run: nothing is removed)" if dry_run else ""
    click.echo(
        f"retention: finished work, receipts (at least 7 days) and sweep cycles after {cfg['RETENTION_DAYS']} days, "
        f"operator actions after {cfg['AUDIT_RETENTION_DAYS']} days{dry}"
    )
    try:
        result = retention.prune(dry_run=dry_run, progress=lambda line: click.echo(f"  {line}"))
    except DBAPIError as exc:
        reason = str(getattr(exc, "orig", exc) or exc).strip().splitlines()[0]
        click.echo(
            f"backstop prune: the database did not answer (DATABASE_URL): {reason}"
            + ("" if dry_run else "; batches committed before this stay removed, run it again when it answers"),
            err=True,
        )
        sys.exit(1)
    for line in result.report_lines():
        click.echo(line)
    if result.skipped:
        sys.exit(1)


@shop_cli.command("stripe-sandbox")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=12111, show_default=True, type=int)
@click.option("--min-session-seconds", default=1800, show_default=True, type=click.IntRange(0, 86400))
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False),
    help="Keep sessions, events and endpoints in this file across restarts.",
)
def stripe_sandbox_command(host, port, min_session_seconds, state_file):
    """Run the Stripe-compatible sandbox (docs/REFERENCE.md, Sandbox)."""
    # Imported when run: the sandbox is its own program (it imports nothing of the shop), and
    # every app, each web worker's included, loads this module to register the commands.
    from .stripe_sandbox.server import run

    run(host=host, port=port, min_session_seconds=min_session_seconds, state_file=state_file)


@shop_cli.command("stripe-register-webhook")
def register_webhook_command():
    """Create this shop's webhook endpoint at the provider and store its signing secret."""
    for line in register_webhook():
        click.echo(line)


@shop_cli.command("check")
@click.option("--json", "as_json", is_flag=True, help='Print {"ok": ..., "checks": [...]} instead of lines.')
def check_command(as_json):
    """The deploy preflight: one line per check; exit 0 when this node is ready, 1 naming what to fix."""
    # Imported when run: the preflight is needed by this command only.
    from .ops import preflight

    checks = preflight.run_checks()
    click.echo(preflight.render_json(checks) if as_json else preflight.render_text(checks))
    sys.exit(0 if preflight.ready(checks) else 1)


@shop_cli.command("web", context_settings={"ignore_unknown_options": True})
@click.option("--host", default="0.0.0.0", show_default=True, help="Where the front listens.")
@click.option("--port", type=click.IntRange(1, 65535), envvar="PORT", default=5000, show_default="$PORT, else 5000")
@click.argument("server", nargs=-1, type=click.UNPROCESSED)
def web_command(host, port, server):
    """The Procfile's web: gunicorn behind nginx, which reads every request whole first.
    SERVER (after `--`) is the gunicorn command line to run behind it, without --bind (the
    command binds it to a loopback socket of its own), as Heroku's start-nginx takes it; without
    one, gunicorn's threaded workers sized by WEB_CONCURRENCY x WEB_THREADS."""
    # Imported when run: only this command supervises nginx and gunicorn.
    from .devserver.front import serve

    cfg = current_app.config
    workers, threads = cfg["WEB_CONCURRENCY"], cfg["WEB_THREADS"]
    sys.exit(serve(host, port, workers, threads, cfg["WEB_FRONT"], server=list(server), trust=cfg["TRUSTED_PROXIES"]))


@shop_cli.command("up")
@click.option("--port", default=5000, show_default=True, type=int)
def up_command(port):
    """The one-command demo: database, seed, operator, Redis, sandbox, web + worker + scheduler."""
    # Imported when run, for the same reason: the supervisor is needed by this command only.
    from .devserver.command import up

    up(current_app.extensions[_APP_FACTORY], port=port)
