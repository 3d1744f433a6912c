"""What `flask shop up` decides before anything starts: the port, the environment every child
shares (the instance folder, the demo's secret key, the database and Redis URLs) and whether this
run starts Redis and the Stripe sandbox itself."""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..settings import instance_path, load_settings, make_private_folder
from .supervise import LOCAL, UpError, free_port, nearby_free_port, port_is_free, redis_answers

SANDBOX_PORT = 12111
OPERATOR_EMAIL = "operator@example.com"
SECRET_KEY_FILE = "secret_key"
SANDBOX_STATE_FILE = "stripe-sandbox.json"
SANDBOX_PORT_FILE = "stripe-sandbox.port"


def redis_url_on(url: str, port: int, password: str | None = None) -> str:
    """REDIS_URL for the Redis `up` starts on `port`: the same database number as `url` names,
    with the password made for this run."""
    parts = urlsplit(url)
    db = parts.path.strip("/") if parts.scheme in ("redis", "rediss") else ""
    auth = f":{password}@" if password else ""
    return f"redis://{auth}{LOCAL}:{port}/{db or '0'}"


@dataclass
class Plan:
    port: int
    env: dict
    root: str
    password: str | None = None  # set only when this run created the operator
    start_redis_on: int | None = None
    # The bundled Redis's password, made for each run (bundled_redis.py): another user of this
    # machine can reach a loopback port, and a Redis without one runs whatever it is sent.
    redis_password: str | None = None
    start_sandbox_on: int | None = None
    sandbox_socket: socket.socket | None = None  # bound and listening, handed to the sandbox
    sandbox_url: str | None = None
    session_min_seconds: int = 1800
    notes: list = field(default_factory=list)
    web_how: str = ""  # what serves the port, for the banner (steps.start_processes)
    cleanup: list = field(default_factory=list)  # directories to remove when `up` ends

    @property
    def base_url(self) -> str:
        return f"http://{LOCAL}:{self.port}"


def repo_root() -> str:
    """Where app.py lives: next to the `shop` package in a checkout (`pip install -e .`)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # shop/devserver/plan.py
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


def private_sqlite_file(url: str) -> None:
    """Create the demo's SQLite file, empty (an empty file is an empty database), readable by its
    owner only before anything is written to it: it holds the operators' password hashes and the
    webhook signing secret. SQLite gives the -wal and -shm files it makes next to it the same
    mode. A file that exists already is left as it is; other databases are none of this."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite") or not parsed.database:
        return
    try:
        os.close(os.open(parsed.database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        pass  # there already; or no such folder, which the migrations report in their own words


def shown_redis_url(url: str) -> str:
    """A Redis URL as `up` prints it: its password, if any, as `***`."""
    return re.sub(r"(//[^:@/]*:)[^@/]+@", r"\1***@", url)


def shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


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
            raise UpError(f"{path} is empty; delete it to make a new secret key (earlier sessions end)") from None
        return key
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    return key


def sandbox_socket(instance: str) -> socket.socket:
    """A listening socket for the sandbox, bound here and handed to it (`--fd`): on the port the
    sandbox had last time (its sessions' payment links name their port, so a restart on another
    one would break the links the demo user has: trying 12111 first moved a sandbox that had once
    found 12111 taken back onto it), else 12111, else any free port. Bound now, not merely found
    free: two `up`s starting at once cannot both pick 12111."""
    path = os.path.join(instance, SANDBOX_PORT_FILE)
    try:
        with open(path, encoding="ascii") as f:
            last = int(f.read().strip())
    except (OSError, ValueError):
        last = None
    sock = None
    for port in (last, SANDBOX_PORT, 0):
        if port is None or not 0 <= port < 65536:
            continue
        candidate = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        candidate.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            candidate.bind((LOCAL, port))
        except OSError:
            candidate.close()
            continue
        sock = candidate
        break
    assert sock is not None, "port 0 lets the system choose a free port"
    sock.listen(128)
    port = sock.getsockname()[1]
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="ascii") as f:
        f.write(f"{port}\n")
    return sock


def make_plan(port: int, environ: Mapping[str, str]) -> Plan:
    """Decide everything the children share, before anything starts."""
    if not 1 <= port <= 65535:
        raise UpError(f"--port must be between 1 and 65535, got {port}")
    if not port_is_free(port):
        raise UpError(
            f"port {port} is already in use on {LOCAL} (another `flask shop up`?); "
            f"choose another with --port, e.g. `flask shop up --port {nearby_free_port(port)}`"
        )
    env = dict(environ)
    root = repo_root()
    env["BACKSTOP_INSTANCE_PATH"] = os.path.abspath(instance_path(env, root))
    make_private_folder(env["BACKSTOP_INSTANCE_PATH"])
    env["FLASK_APP"] = "app"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("SCHEDULER_POLL_SECONDS", "1")
    # The demo's /metrics stays open to whoever runs it, whatever PUBLIC_BASE_URL says.
    env.setdefault("METRICS_PUBLIC", "1")
    if not (env.get("SECRET_KEY") or "").strip():
        env["SECRET_KEY"] = demo_secret_key(env["BACKSTOP_INSTANCE_PATH"])
    if not (env.get("PUBLIC_BASE_URL") or "").strip():
        env["PUBLIC_BASE_URL"] = f"http://{LOCAL}:{port}"

    settings = load_settings(env, env["BACKSTOP_INSTANCE_PATH"], argv=["flask", "shop", "up"])
    env["DATABASE_URL"] = absolute_database_url(settings.database_url)
    private_sqlite_file(env["DATABASE_URL"])
    plan = Plan(port=port, env=env, root=root, session_min_seconds=settings.stripe_session_min_seconds)

    _plan_redis(plan, settings.redis_url)

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
            plan.sandbox_socket = sandbox_socket(env["BACKSTOP_INSTANCE_PATH"])
            plan.start_sandbox_on = plan.sandbox_socket.getsockname()[1]
            plan.sandbox_url = f"http://{LOCAL}:{plan.start_sandbox_on}"
            env["STRIPE_API_BASE"] = plan.sandbox_url
    return plan


def _plan_redis(plan: Plan, redis_url: str) -> None:
    """REDIS_URL as it is, when something answers there; else the bundled Redis's, on its port
    when free, with a password made for this run."""
    plan.env["REDIS_URL"] = redis_url
    if not redis_answers(redis_url):
        wanted = urlsplit(redis_url).port if redis_url.startswith("redis") else None
        plan.start_redis_on = wanted if wanted and port_is_free(wanted) else free_port()
        plan.redis_password = secrets.token_urlsafe(24)
        plan.env["REDIS_URL"] = redis_url_on(redis_url, plan.start_redis_on, plan.redis_password)
        if redis_url_on(redis_url, plan.start_redis_on) != shown_redis_url(redis_url):
            plan.notes.append(
                f"Nothing answers at REDIS_URL={shown_redis_url(redis_url)} and its port is not free "
                f"here; the bundled Redis will serve {shown_redis_url(plan.env['REDIS_URL'])} instead"
            )
