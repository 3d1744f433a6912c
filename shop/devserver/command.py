"""The `flask shop up` command itself: make the plan, start the services and the shop's processes
in order, watch them until a signal or a death, and stop every one of them whatever happens."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable

from flask import Flask

from ..settings import SettingsError
from .bundled_redis import start_redis
from .plan import Plan, make_plan
from .steps import banner, prepare_database, register_webhook, start_processes, start_sandbox
from .supervise import (
    START_TIMEOUT,
    Console,
    Supervisor,
    UpError,
    ellipsis,
    http_status,
    redis_answers,
    wait_until,
    web_serves,
)


class _Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP arrived while `up` was still preparing."""


def up(create_app: Callable[..., Flask], port: int = 5000) -> None:
    """Run the demo in the foreground until Ctrl-C (or SIGTERM); exits non-zero if a child dies.
    `create_app` is the app factory, handed in by the CLI (the factory registers the CLI, so
    nothing under it imports the factory back)."""
    # Whatever `up` and its children create (the SQLite file and its -wal/-shm, the sandbox's
    # state, gunicorn's temporary files) is for this user only: the demo's data holds password
    # hashes, the webhook signing secret and order links. Children inherit the mask.
    previous_umask = os.umask(0o077)
    console = Console()
    sup = Supervisor(console)
    state = {"signal": None, "raise": True}

    def on_signal(signum, _frame):
        if sup.stopping:
            sup.force = True  # a second Ctrl-C: stop waiting for graceful exits
            return
        if state["signal"] is None:
            state["signal"] = signum
        if state["raise"]:
            raise _Interrupted()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    code = 0
    plan_holder: list = []
    try:
        code = _run(create_app, port, console, sup, state, plan_holder)
    except UpError as exc:
        console.error(str(exc))
        code = 1
    except _Interrupted:
        console.step("Interrupted while starting")
        code = 0
    finally:
        state["raise"] = False
        _stop_and_restore(console, sup, previous, previous_umask, plan_holder)
    if code:
        raise SystemExit(code)


def _stop_and_restore(console: Console, sup: Supervisor, previous: dict, previous_umask: int, plan_holder: list):
    """What `up` leaves behind, however it ended: its children stopped (last started, first
    stopped), the signal handlers and the umask it replaced put back, its temporary folders gone."""
    if sup.children:
        console.step(f"Stopping {', '.join(c.name for c in sup.stop_order())}{ellipsis()}")
        stopped, stuck = sup.stop_all()
        console.step(f"Stopped {', '.join(stopped)}." if stopped else "Stopped.")
        if stuck:
            console.error(f"could not stop {', '.join(stuck)}")
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    os.umask(previous_umask)
    for plan in plan_holder:
        for folder in plan.cleanup:
            shutil.rmtree(folder, ignore_errors=True)


def _run(
    create_app: Callable[..., Flask], port: int, console: Console, sup: Supervisor, state: dict, plan_holder: list
) -> int:
    try:
        plan = make_plan(port, os.environ)
        plan_holder.append(plan)
        app = create_app(env=plan.env)
    except SettingsError as exc:
        raise UpError(f"configuration error: {exc}") from None
    for note in plan.notes:
        console.step(note)
    # Redis and the sandbox boot while the migrations run; web, worker and scheduler start as
    # soon as Redis answers, and the webhook is registered while they import the app.
    redis = start_redis(plan, sup, console) if plan.start_redis_on else None
    sandbox = start_sandbox(plan, sup, console) if plan.start_sandbox_on else None
    prepare_database(plan, app, console)
    if redis is not None:
        wait_until(lambda: redis_answers(plan.env["REDIS_URL"], timeout=0.2), redis, "redis-server")
    start_processes(plan, sup, console)
    if sandbox is not None:
        sandbox_url = plan.sandbox_url
        assert sandbox_url is not None, "make_plan gives the sandbox it starts a URL"
        wait_until(lambda: http_status(sandbox_url + "/_sandbox/faults") == 200, sandbox, "the Stripe sandbox")
    if plan.sandbox_url:
        register_webhook(plan, app, console)

    # From here on a signal only sets the flag; the loop below notices it and stops cleanly.
    state["raise"] = False
    if state["signal"] is not None:
        return 0
    return _watch(plan, console, sup, state)


def _watch(plan: Plan, console: Console, sup: Supervisor, state: dict) -> int:
    """Until a signal: stop at the first child that dies, announce the shop once /healthz
    answers, give up if it never does. Returns the exit code."""
    ready_by = time.monotonic() + START_TIMEOUT
    ready = False
    while state["signal"] is None:
        dead = sup.first_death()
        if dead is not None:
            console.error(f"{dead.name} exited unexpectedly (code {dead.proc.returncode}); stopping the others")
            return 1
        if not ready:
            # A generous timeout: while gunicorn's workers still import the app the kernel
            # queues the connection, and a short one would only pile up retries.
            if web_serves(plan.base_url + "/healthz", timeout=5):
                ready = True
                banner(plan, console)
            elif time.monotonic() > ready_by:
                console.error(
                    f"the web process did not answer {plan.base_url}/healthz within {START_TIMEOUT:.0f} s; stopping"
                )
                return 1
        time.sleep(0.2)
    name = signal.Signals(state["signal"]).name
    console.line()
    console.step(f"{name} received")
    return 0
