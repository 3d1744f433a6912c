"""`flask shop up` end to end: the real command as a subprocess, with its bundled Redis, the
Stripe sandbox, gunicorn, a worker and a scheduler, driven over HTTP like a person would."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid

import pytest
import requests
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from werkzeug.test import TestResponse

import shop
from payment_helpers import Shopper
from port_support import free_port
from process_support import ConnectionsTo, Tricklers, catalog_answers
from shop.devserver.front import nginx_binary
from shop.devserver.plan import SANDBOX_PORT_FILE
from shop.devserver.supervise import stop_bound
from support import wait_until

# How long `up` may take to end once told to stop or once a child died: the product's own bound
# for its six children at most (the graces, then a reap and a last read of each), then the
# interpreter's own exit on a busy machine.
UP_STOPS_WITHIN = stop_bound(6) + 10

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(shop.__file__)))
CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def processes_carrying(marker: str) -> list[tuple[int, str]]:
    """Every live process whose environment holds `marker` (each child `up` starts inherits it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie:
            found.append((int(pid), cmdline))
    return found


@pytest.fixture
def up_database():
    """The database `up` should use: the default SQLite file under the instance folder, or a
    fresh PostgreSQL database when the suite runs on PostgreSQL."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        yield None
        return
    server = make_url("postgresql+psycopg://" + url.split("://", 1)[1])
    name = f"backstop_up_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield server.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


class Up:
    """`flask --app app shop up` in its own process group, its output collected line by line."""

    def __init__(self, tmp_path, database_url, *extra_args, port=None, env_extra=None):
        self.port = port or free_port()
        self.redis_port = free_port()  # nothing listens there, so `up` must start redis-server
        self.marker = f"up-test-{uuid.uuid4().hex}"
        self.instance = tmp_path / "instance"
        self._reserve_a_sandbox_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "SECRET_KEY", "PUBLIC_BASE_URL", "FLASK_APP") and not k.startswith("STRIPE_")
        }
        env.update(
            BACKSTOP_INSTANCE_PATH=str(self.instance),
            REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
            BACKSTOP_UP_TEST_MARKER=self.marker,
            PYTHONUNBUFFERED="1",
        )
        if database_url:
            env["DATABASE_URL"] = database_url
        env.update(env_extra or {})
        self.database_url = database_url or f"sqlite:///{self.instance}/backstop.sqlite3"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "app", "shop", "up", "--port", str(self.port), *extra_args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _reserve_a_sandbox_port(self) -> None:
        """The sandbox's port, reserved like every port a test starts something on, written where
        `up` keeps it across restarts (created 0700 and 0600, as `up` makes them). Left to `up`
        it would be 12111 when free, and the process lanes' `up`s side by side would race for
        it: a restart that found it taken meanwhile moved its sandbox to another port."""
        port_file = self.instance / SANDBOX_PORT_FILE
        if port_file.exists():
            return
        self.instance.mkdir(mode=0o700, parents=True, exist_ok=True)
        with os.fdopen(os.open(port_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(f"{free_port()}\n")

    def _read(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.append(raw.decode(errors="replace").rstrip())

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 30) -> re.Match:
        def matched():
            match = next((m for line in list(self.lines) if (m := re.search(pattern, line))), None)
            assert match or self.proc.poll() is None, f"`up` exited ({self.proc.returncode}):\n{self.output}"
            return match

        return wait_until(matched, timeout, f"a line matching {pattern!r}", lambda: self.output)

    def wait_until_up(self) -> dict:
        self.wait_for_line(r"^Backstop is up\.")
        password = re.search(r"^\s+login\s+operator@example\.com / (\S+)$", self.output, re.M)
        return {
            "storefront": self.wait_for_line(r"^\s+Storefront\s+(\S+)").group(1).rstrip("/"),
            "sandbox": self.wait_for_line(r"^\s+Stripe\s+(http://\S+)").group(1).rstrip("/"),
            "password": password.group(1) if password else None,
        }

    def interrupt(self):
        """Ctrl-C, as a terminal sends it to the foreground group, and wait for `up` to finish."""
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=UP_STOPS_WITHIN)
        self._close_output()
        assert self.proc.returncode == 0, self.output

    def _close_output(self):
        """The reader ends at the pipe's end, once `up` and its children are gone."""
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        # The children live in their own sessions; up's SIGKILL reaches them as SIGTERM (Linux
        # parent-death signal). Give them a moment, then make sure nothing is left behind.
        try:
            wait_until(lambda: not processes_carrying(self.marker), 10, "up's children to end by themselves")
        except AssertionError:
            pass  # killed below
        for pid, _ in processes_carrying(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._close_output()


@pytest.fixture
def run_up(tmp_path, up_database):
    started = []

    def start(*args, **kwargs):
        handle = Up(tmp_path, up_database, *args, **kwargs)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


def _wait_for_status(session, url, wanted, timeout=20.0):
    def reached():
        status = session.get(url, headers={"Accept": "application/json"}).json()["status"]
        return status if status == wanted else None

    return wait_until(reached, timeout, f"{url} to be {wanted}")


def _assert_all_children_gone(up: Up, timeout: float = 10.0):
    wait_until(lambda: not processes_carrying(up.marker), timeout, "up's children to be gone", lambda: up.output)
    for port in (up.port, up.redis_port):
        assert not answers(port), f"something still answers on port {port}"


def _log_in(browser, base, password) -> bool:
    token = CSRF.search(browser.get(base + "/console/login", headers={"Accept": "text/html"}).text).group(1)
    r = browser.post(
        base + "/console/login",
        allow_redirects=False,
        data={"csrf_token": token, "email": "operator@example.com", "password": password},
    )
    return r.status_code in (302, 303) and "/console/login" not in r.headers["Location"]


def _check_out(browser, base) -> TestResponse:
    """Put one item in the cart and check out; the response is the checkout's own (303)."""
    catalog = browser.get(base + "/", headers={"Accept": "application/json"}).json()
    variant = next(v for p in catalog["products"] for v in p["variants"] if v["available"] > 0)
    return Shopper.over_http(base, {variant["sku"]: variant["id"]}, session=browser).checkout(variant["sku"])


def test_a_restarted_up_keeps_the_browsers_orders_the_payment_link_and_the_operator_password(run_up):
    first = run_up()
    urls = first.wait_until_up()
    base, sandbox, password = urls["storefront"], urls["sandbox"], urls["password"]
    assert password, first.output
    key_file = first.instance / "secret_key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text()

    browser = requests.Session()
    r = _check_out(browser, base)
    assert r.status_code == 303 and r.headers["Location"].startswith(sandbox + "/pay/"), r.text
    pay_url = r.headers["Location"]
    orders = browser.get(base + "/orders", headers={"Accept": "application/json"}).json()["orders"]
    assert len(orders) == 1
    first.interrupt()

    second = run_up(port=first.port)
    urls = second.wait_until_up()
    assert urls["storefront"] == base and urls["sandbox"] == sandbox
    assert urls["password"] is None, "a restart must not print (or set) a new password"
    assert "flask shop create-operator operator@example.com" in second.output
    assert key_file.read_text() == key and key_file.stat().st_mode & 0o777 == 0o600

    # The same browser (same cookie) still finds its order, and the order page opens.
    again = browser.get(base + "/orders", headers={"Accept": "application/json"}).json()["orders"]
    assert [o["reference"] for o in again] == [orders[0]["reference"]]
    assert browser.get(f"{base}/orders/{orders[0]['reference']}", headers={"Accept": "text/html"}).status_code == 200
    # The sandbox remembers the session: its payment page still opens.
    page = requests.get(pay_url)
    assert page.status_code == 200 and "not found" not in page.text.lower(), page.text[:500]
    assert _log_in(requests.Session(), base, password)
    second.interrupt()


def test_up_hands_its_session_minimum_to_the_sandbox_so_a_short_minimum_is_not_refused(run_up):
    up = run_up(
        env_extra={
            "STRIPE_SESSION_MIN_SECONDS": "90",
            "UNPAID_ORDER_EXPIRY_SECONDS": "120",
            "RECONCILIATION_STUCK_AGE_SECONDS": "120",
        }
    )
    urls = up.wait_until_up()
    r = _check_out(requests.Session(), urls["storefront"])
    assert r.status_code == 303, r.text
    assert r.headers["Location"].startswith(urls["sandbox"] + "/pay/"), (r.headers["Location"], up.output)
    assert "min session 90s" in up.output


def test_up_serves_a_whole_purchase_and_ctrl_c_stops_every_child(run_up):
    up = run_up()
    urls = up.wait_until_up()
    base, sandbox = urls["storefront"], urls["sandbox"]
    assert base == f"http://127.0.0.1:{up.port}"
    assert "Starting Redis (bundled redis-server) on port" in up.output
    # A quiet first run: the migrations in one line, the libraries' warnings in at most one, and
    # no access line of up's own probes of /healthz before the banner.
    before_banner = up.output.split("Backstop is up.", 1)[0]
    migrations = len([f for f in os.listdir(os.path.join(ROOT, "migrations", "versions")) if f.endswith(".py")])
    assert re.search(rf"^    applied {migrations} migrations, now at \w+$", before_banner, re.M), before_banner
    assert "Running upgrade" not in before_banner and "alembic" not in before_banner
    assert len(re.findall(r"Warning", before_banner)) <= 1, before_banner
    assert "/healthz" not in before_banner
    mail_folder = os.path.join(up.instance, "mail")
    assert re.search(rf"^\s+Mail\s+written to {re.escape(mail_folder)}/ .*{base}/console/mail$", up.output, re.M)
    front = nginx_binary() is not None
    if front:
        served = rf"^\s+served by\s+nginx on 127\.0\.0\.1:{up.port}, reading each request whole"
        assert re.search(served, up.output, re.M), up.output

    browser = requests.Session()
    catalog = browser.get(base + "/", headers={"Accept": "application/json"}).json()
    variants = [v for p in catalog["products"] for v in p["variants"] if v["available"] > 0]
    assert len(catalog["products"]) == 3 and variants
    # 200 once the worker and the scheduler have left their first heartbeats.
    health = wait_until(
        lambda: (h := browser.get(base + "/healthz")).status_code == 200 and h,
        30,
        "a healthy /healthz",
        lambda: up.output,
    )
    assert health.status_code == 200 and health.json()["redis"] == "ok", health.json()
    assert requests.get(sandbox + "/_sandbox/faults").status_code == 200

    engine = create_engine(up.database_url)
    try:
        with engine.connect() as conn:
            secret = conn.execute(text("SELECT value FROM kv_store WHERE key = 'stripe_webhook_secret'")).scalar()
        assert secret and secret.startswith("whsec_")
    finally:
        engine.dispose()

    login = browser.get(base + "/console/login", headers={"Accept": "text/html"})
    token = CSRF.search(login.text).group(1)
    r = browser.post(
        base + "/console/login",
        allow_redirects=False,
        data={"csrf_token": token, "email": "operator@example.com", "password": urls["password"]},
    )
    assert r.status_code in (302, 303) and "/console/login" not in r.headers["Location"]

    customer = Shopper.over_http(base, {v["sku"]: v["id"] for v in variants}, session=browser)
    r = customer.checkout(variants[0]["sku"])
    assert r.status_code == 303, r.text
    pay_url = r.headers["Location"]
    assert pay_url.startswith(sandbox + "/pay/")
    session_id = pay_url.rsplit("/", 1)[1]
    reference = browser.get(base + "/orders", headers={"Accept": "application/json"}).json()["orders"][0]["reference"]

    r = requests.post(f"{sandbox}/_sandbox/sessions/{session_id}/outcome", json={"outcome": "paid"})
    assert r.status_code == 200, r.text
    # Only the sandbox's signed webhook, received by the running web process, can make it Paid.
    assert _wait_for_status(browser, f"{base}/orders/{reference}", "Paid") == "Paid", up.output
    # The private link works, and the access log keeps its "?" but never writes its token.
    page = browser.get(f"{base}/orders/{reference}", headers={"Accept": "text/html"}).text
    link = re.search(rf"/orders/{reference}\?token=([A-Za-z0-9_-]+)", page)
    assert link, page
    access_token = link.group(1)
    assert requests.get(f"{base}{link.group(0)}", headers={"Accept": "application/json"}).status_code == 200
    # The return page's link names the session, which shows the order: the access log hides it too.
    browser.get(f"{base}/checkout/return", params={"session_id": session_id}, headers={"Accept": "text/html"})
    # The receipt is a file named by the order's reference, and the console's mail page lists it.
    receipt = f"{reference}-order_paid-event.eml"
    wait_until(lambda: os.path.exists(os.path.join(mail_folder, receipt)), 30, "the receipt's file", lambda: up.output)
    listed = browser.get(base + "/console/mail", headers={"Accept": "application/json"}).json()["messages"]
    assert receipt in [m["name"] for m in listed], listed

    assert processes_carrying(up.marker), "the children should be running before Ctrl-C"
    os.killpg(up.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends to the foreground group
    up.proc.wait(timeout=UP_STOPS_WITHIN)
    assert up.proc.returncode == 0, up.output
    # up itself saw every child exit (not merely the parent-death signal after it was gone).
    stopped = "web, front, worker, scheduler" if front else "web, worker, scheduler"
    assert f"==> Stopped {stopped}, sandbox, redis." in up.output
    _assert_all_children_gone(up)
    assert not answers(int(sandbox.rsplit(":", 1)[1]))
    assert "Traceback" not in up.output
    assert f"/orders/{reference}?token=[hidden]" in up.output, up.output  # complete once up has ended
    assert access_token not in up.output
    assert "/checkout/return?session_id=[hidden]" in up.output and f"session_id={session_id}" not in up.output
    # The bundled Redis has a password for this run, which up never prints.
    assert re.search(r"^\s+Redis\s+redis://:\*\*\*@127\.0\.0\.1:\d+/0 ", up.output, re.M), up.output


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (apt-get install nginx-light)")
def test_up_puts_nginx_before_gunicorn_so_200_slow_clients_hold_no_thread(run_up):
    up = run_up()
    base = up.wait_until_up()["storefront"]
    gunicorn = int(up.wait_for_line(r"in front of gunicorn on 127\.0\.0\.1:(\d+)").group(1))
    with Tricklers("127.0.0.1", up.port, count=200, gap=3.0) as slow:
        try:
            wait_until(lambda: slow.connected >= 200, 10, "200 slow clients to connect")
        except AssertionError:
            pass  # the summary below says how many held on
        with ConnectionsTo(gunicorn) as to_gunicorn:
            answers = catalog_answers(base, 15.0)
        held = slow.connected
    summary = (
        f"{sum(answers)} of {len(answers)} catalog requests answered; at most {to_gunicorn.most} connections "
        f"to gunicorn; {held} slow clients connected"
    )
    assert held >= 180 and len(answers) >= 100 and all(answers), summary
    # nginx hands gunicorn whole requests only: the slow clients end at nginx, and gunicorn sees
    # the catalog's requests one at a time, not a connection (and a thread) per slow client.
    assert to_gunicorn.most < 20, summary
    up.interrupt()
    _assert_all_children_gone(up)


def test_up_without_nginx_says_so_and_serves_with_gunicorn_alone(run_up):
    up = run_up(env_extra={"BACKSTOP_NGINX": "/nonexistent/nginx"})
    base = up.wait_until_up()["storefront"]
    assert re.search(
        r"^==> WARNING: BACKSTOP_NGINX=/nonexistent/nginx is not an executable file: gunicorn serves "
        rf"127\.0\.0\.1:{up.port} itself, and a slow or idle client can hold one of its threads",
        up.output,
        re.M,
    ), up.output
    assert re.search(r"^\s+served by\s+gunicorn, threaded workers, directly \(no nginx in front\)$", up.output, re.M)
    assert requests.get(base + "/", headers={"Accept": "application/json"}, timeout=10).status_code == 200
    up.interrupt()
    assert "==> Stopped web, worker, scheduler, sandbox, redis." in up.output
    _assert_all_children_gone(up)


def test_a_child_that_dies_stops_the_others_and_up_exits_non_zero_naming_it(run_up):
    up = run_up()
    up.wait_until_up()
    workers = [pid for pid, cmd in processes_carrying(up.marker) if cmd.endswith("shop worker")]
    assert len(workers) == 1, processes_carrying(up.marker)
    os.kill(workers[0], signal.SIGKILL)

    up.proc.wait(timeout=UP_STOPS_WITHIN)
    assert up.proc.returncode != 0
    assert re.search(r"backstop up: worker exited unexpectedly", up.output), up.output
    _assert_all_children_gone(up)


def test_up_on_a_port_in_use_says_so_in_one_line_and_starts_nothing(run_up):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        up = run_up(port=taken.getsockname()[1])
        up.proc.wait(timeout=20)
        up._reader.join(timeout=5)
    assert up.proc.returncode == 1
    assert f"port {up.port} is already in use" in up.output and "--port" in up.output, up.output
    assert "Traceback" not in up.output
    assert processes_carrying(up.marker) == []


def test_what_ups_preparation_writes_is_readable_by_its_owner_only(tmp_path):
    """The instance folder, the demo's secret key, the SQLite file (password hashes, the webhook
    signing secret) and the sandbox's state: 0700 and 0600 whatever the umask, before anything
    is written to them. Without starting anything: the plan alone."""
    import stat

    from shop.devserver.plan import make_plan
    from shop.devserver.supervise import free_port
    from shop.stripe_sandbox.persist import StateFile
    from shop.stripe_sandbox.state import Sandbox

    instance = tmp_path / "instance"
    environ = {"BACKSTOP_INSTANCE_PATH": str(instance), "STRIPE_API_BASE": "http://127.0.0.1:9"}
    old = os.umask(0o022)
    try:
        plan = make_plan(free_port(), environ)
        state_file = instance / "stripe-sandbox.json"
        StateFile(Sandbox(start_threads=False), str(state_file)).save()
    finally:
        os.umask(old)
    database = make_url(plan.env["DATABASE_URL"]).database
    assert database == str(instance / "backstop.sqlite3")

    def mode(path):
        return stat.S_IMODE(os.stat(path).st_mode)

    assert mode(instance) == 0o700
    assert (mode(instance / "secret_key"), mode(database), mode(state_file)) == (0o600, 0o600, 0o600)
    # The empty file SQLite is handed is a database it opens, and the migrations fill it.
    engine = create_engine(plan.env["DATABASE_URL"])
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
        conn.commit()
    engine.dispose()
    assert mode(database) == 0o600


def test_two_ups_starting_at_once_never_pick_the_same_sandbox_port(tmp_path):
    """The sandbox's port is bound when `up` plans it and handed to the sandbox (`--fd`): a second
    `up` planning meanwhile finds it taken and gets another, instead of both picking 12111 and
    one sandbox dying with "Address already in use"."""
    from shop.devserver.plan import sandbox_socket

    first_folder, second_folder = tmp_path / "a", tmp_path / "b"
    first_folder.mkdir()
    second_folder.mkdir()
    first = sandbox_socket(str(first_folder))
    second = sandbox_socket(str(second_folder))
    try:
        ports = {first.getsockname()[1], second.getsockname()[1]}
        assert len(ports) == 2
        for sock in (first, second):  # both listening: a client connects before any server runs
            with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=2):
                pass
    finally:
        first.close()
        second.close()
