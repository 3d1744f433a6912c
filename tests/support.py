"""Plain helpers the tests and conftest share (conftest keeps fixtures and hooks only; no test
module imports from it): this run's own Redis database and app config, the unreachable provider,
a browser's CSRF token, the operator's login, the heartbeats of a running worker and
scheduler, the one wait for a condition (`wait_until`) and the clock a test moves by hand
(`FakeClock`). A customer's checkout through the storefront is payment_helpers.Shopper's."""

from __future__ import annotations

import email
import os
import re
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from shop.clock import SystemClock
from shop.extensions import db

RUN_ID = uuid.uuid4().hex[:8]
# The checkout the tests run from (tests/ is one level down, each test package two).
REPO_ROOT = Path(__file__).resolve().parent.parent

LOCKS_URL = os.environ.get("TEST_REDIS_LOCKS_URL", "redis://127.0.0.1:6379/15")
TEST_DBS = range(1, 15)  # 0 is the shop's default, 15 holds the locks
# A run renews its lock as it goes (pytest_runtest_logstart), so a run that was killed frees its
# database within this long instead of holding it for hours.
LOCK_SECONDS = 900
# STRIPE_API_BASE for a provider that refuses connections at once: port 9 (discard) on loopback,
# where nothing listens. A checkout then leaves the order PendingPayment with "Pay now".
UNREACHABLE_PROVIDER = "http://127.0.0.1:9"


def _claim_redis_db() -> str:
    """A Redis database of its own for this pytest run: tests flush it (Redis losing everything
    is a case we test), so two runs on one machine must never share one. Databases 1-14 are
    claimed with lock keys kept in database 15 (which no test flushes) that expire if a run
    dies; TEST_REDIS_URL overrides the choice. Claimed on first use, not at import: the pure
    domain's tests (tests/domain) run with no Redis and no database at all."""
    if os.environ.get("TEST_REDIS_URL"):
        return os.environ["TEST_REDIS_URL"]
    from redis import Redis

    locks = Redis.from_url(LOCKS_URL)
    try:
        for index in TEST_DBS:
            if locks.set(f"backstop-test-run-lock:{index}", RUN_ID, nx=True, ex=LOCK_SECONDS):
                return LOCKS_URL.rsplit("/", 1)[0] + f"/{index}"
    finally:
        locks.close()
    raise RuntimeError(f"every Redis test database {TEST_DBS[0]}-{TEST_DBS[-1]} is claimed by another test run")


_claimed: list[str] = []


def redis_url() -> str:
    """This run's Redis database, claimed on the first call."""
    if not _claimed:
        _claimed.append(_claim_redis_db())
    return _claimed[0]


def base_config(database_url: str, **overrides) -> dict:
    """The app config every test app starts from: this run's database, Redis and queue prefix,
    and retries short enough for a test to watch."""
    config = {
        "TESTING": True,
        "SECRET_KEY": "test-secret",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url(),
        "QUEUE_PREFIX": f"bt-{RUN_ID}",
        "PUBLIC_BASE_URL": "http://127.0.0.1:5000",
        "OUTBOX_RETRY_BASE_SECONDS": 0.05,
        "OUTBOX_RETRY_CAP_SECONDS": 0.2,
        "OUTBOX_PROVIDER_RETRY_BASE_SECONDS": 0.05,
        "OUTBOX_PROVIDER_RETRY_CAP_SECONDS": 0.2,
        "STRIPE_MAX_NETWORK_RETRIES": 0,
        "STRIPE_TIMEOUT_SECONDS": 5,
        # Scraped without a token throughout; the tests of METRICS_TOKEN set it themselves.
        "METRICS_TOKEN": None,
        # Each scrape reads the database afresh, as tests change it between scrapes; the test of
        # the scrape cache sets its own (tests/web/test_metrics_guard.py).
        "METRICS_CACHE_SECONDS": 0,
        # Tests and models come back to the return page far more often than a customer does; the
        # tests of its throttle set their own limit (tests/web/test_checkout_return.py).
        "CHECKOUT_RETURN_PER_MINUTE": 100_000,
        # A customer's call takes a budget grant only if it can write its request within 0.1 s of
        # it (provider/guard/budget.py, confirm), else it asks again within this patience, then
        # the order joins the line. A loaded test machine misses 0.1 s often enough that 0.2 s of
        # patience sent a lone shopper's checkout to the line (no worker serves it here); the
        # tests of the line and the bulkhead set their own.
        "STRIPE_CUSTOMER_WAIT_SECONDS": 2.0,
        # A customer's request may start a provider call only within its first 9 s (the request's
        # budget, docs/REFERENCE.md, Guarantees). Under a loaded run an in-process checkout on
        # SQLite once took that long before its session call, which the shop then rightly did not
        # make; the tests of the budget set it themselves (9 s where they pin the guarantee).
        "STRIPE_REQUEST_BUDGET_SECONDS": 30.0,
    }
    config.update(overrides)
    return config


_CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def csrf_token(client, url: str = "/cart") -> str:
    """The token a browser would read from a rendered form."""
    page = client.get(url, headers={"Accept": "text/html"})
    match = _CSRF.search(page.get_data(as_text=True))
    assert match, f"no csrf_token in {url}"
    return match.group(1)


OPERATOR_EMAIL, OPERATOR_PASSWORD = "night-shift@example.com", "correct horse battery staple"


def add_operator(app) -> None:
    """As `flask shop create-operator` does, with a cheap hash so the tests stay fast (any
    werkzeug method verifies the same way); one test goes through upsert_operator itself."""
    from werkzeug.security import generate_password_hash

    from shop.models import Operator

    with app.app_context():
        db.session.add(
            Operator(
                email=OPERATOR_EMAIL, password_hash=generate_password_hash(OPERATOR_PASSWORD, "pbkdf2:sha256:1000")
            )
        )
        db.session.commit()


def log_in(app, client) -> str:
    """Create the operator, log in through the form; returns the session's CSRF token."""
    add_operator(app)
    return log_in_again(client)


def log_in_again(client) -> str:
    """Log the existing operator in through the form; returns the CSRF token of the new session
    (the login drops the one of the anonymous session: a token read before it is refused after)."""
    token = csrf_token(client, "/console/login")
    r = client.post(
        "/console/login", data={"csrf_token": token, "email": OPERATOR_EMAIL, "password": OPERATOR_PASSWORD}
    )
    assert r.status_code == 303, r.get_data(as_text=True)
    return csrf_token(client, "/console/audit")


def leave_heartbeats(app) -> None:
    """The heartbeats a running worker and scheduler leave, written by the same code their
    processes run (a real RQ worker registration, the scheduler's own beat), without running
    them: for tests of /healthz and the dashboard that are not about liveness."""
    from shop import queue

    with app.app_context():
        worker = registered_worker(f"test-worker-{uuid.uuid4().hex[:8]}")
        worker.heartbeat()
        queue.make_scheduler().heartbeat()


def registered_worker(name: str | None = None):
    """A worker of the current app registered with RQ by its own code, as its process's start
    does, but without the pulse thread a real worker starts there: a test that wants only the
    record must not leave a thread in the test process beating into Redis after it. Judged by
    its full beat (HEALTH_STALE_SECONDS), as a worker that does not pulse is."""
    from shop import queue

    worker = queue.make_worker(name=name)
    worker.pulse_key = ""
    worker.register_birth()
    return worker


def run_threads(app, jobs, worker):
    """Start one thread per job, released together by a barrier, each in its own app context
    (its own session and connection). Returns (results, errors) in job order."""
    barrier = threading.Barrier(len(jobs))
    results, errors = [None] * len(jobs), [None] * len(jobs)

    def body(i, job):
        with app.app_context():
            try:
                barrier.wait(timeout=30)
                results[i] = worker(job)
            except BaseException as exc:  # noqa: BLE001 - the test reports every failure
                errors[i] = exc
            finally:
                db.session.remove()

    threads = [threading.Thread(target=body, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a checkout thread hung"
    return results, errors


def rows_in(app, model, **filters) -> list:
    """Every row of `model` whose columns equal `filters`, in primary-key order, read in an app
    context of its own and detached from its session (their loaded attributes stay readable)."""
    with app.app_context():
        rows = db.session.query(model).filter_by(**filters).order_by(*model.__table__.primary_key.columns).all()
        db.session.expunge_all()
        db.session.remove()
        return rows


def poll_until(predicate, timeout: float = 5.0, interval: float = 0.05):
    """Poll `predicate()` until it returns something true or `timeout` seconds have passed, and
    return what it returned last: the wait that may end without its condition, for a caller
    that decides itself what that means (a process that would not stop, a moment never seen)."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last or time.monotonic() >= deadline:
            return last
        time.sleep(interval)


def first_look_misses(monkeypatch, module) -> list[str]:
    """Make `module._earlier` (an operator submission's look for an earlier one of its key) miss
    once, as when the winner commits between the loser's look and its insert; returns the keys
    looked for, in order."""
    looks: list[str] = []
    real = module._earlier

    def not_yet_committed(request_key):
        looks.append(request_key)
        return None if len(looks) == 1 else real(request_key)

    monkeypatch.setattr(module, "_earlier", not_yet_committed)
    return looks


def wait_until(predicate, timeout: float = 5.0, what: str = "the condition", logs=None, interval: float = 0.05):
    """Poll `predicate()` until it returns something true, and return that. After `timeout`
    seconds fail, naming `what` was waited for and what the predicate returned last (and
    `logs()`, the processes' output, when given). The one failing wait of the tests."""
    last = poll_until(predicate, timeout, interval)
    if last:
        return last
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}; the last check returned {last!r}"
        + (f"\n{logs()}" if logs else "")
    )


class FakeClock:
    """A clock a test moves by hand (shop.clock.Clock), given to the app as create_app's CLOCK:
    the time of day starts at the real one and stands still until `advance`d; sleeping on it
    lets the time pass at once. It is also the time the guard's scripts take as Redis's
    (`shared_time`), so a token bucket refills and a breaker's probe falls due as it moves."""

    def __init__(self, start: datetime | None = None):
        self._lock = threading.Lock()
        self._now = start or datetime.now(timezone.utc)
        self._monotonic = time.monotonic()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def time(self) -> float:
        return self.now().timestamp()

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._monotonic += seconds

    def catch_up(self, seconds: float = 0.0) -> None:
        """Move on to the real time of day plus `seconds` (never back): past something written
        on the real clock (an RQ heartbeat), by as much as a sleep would have let pass."""
        behind = (datetime.now(timezone.utc) - self.now()).total_seconds() + seconds
        self.advance(max(0.0, behind))

    def shared_time(self) -> float | None:
        return self.time()


class SleepingClock(FakeClock):
    """A FakeClock on which only the product's own sleeps let time pass, and they take real time
    as well: its waits (a 429's Retry-After, the rate budget's) reach the provider as real gaps,
    while the work between them, however slow a loaded machine makes it, takes none of a
    request's budget. For tests that pin which waits fit in a deadline."""

    def sleep(self, seconds: float) -> None:
        SystemClock().sleep(max(0.0, seconds))  # the product's own wait, as it sleeps in production
        self.advance(max(0.0, seconds))


def mails(folder, template: str) -> list:
    """The emails of `template` that the mailer wrote as .eml files under `folder` (SMTP_URL unset),
    oldest first, each read whole and its file closed."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        if f"-{template}-" in name and name.endswith(".eml"):
            with open(os.path.join(folder, name), "rb") as fh:
                found.append(email.message_from_binary_file(fh))
    return found
