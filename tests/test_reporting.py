"""Error reports (docs/REFERENCE.md, Settings: SENTRY_DSN): off and not even imported without the
setting; with it, an error of a request, or of a worker's job (RQ's integration, reporting after
the job's own scope has closed), reaches the DSN's server tagged with the order it was about. The
server is a local one started here, as a Sentry would take the SDK's envelopes."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lane_priority import start_thread
from payment_helpers import Shopper
from shop import create_app
from shop.settings import SettingsError
from support import wait_until

ROOT = Path(__file__).resolve().parent.parent


def test_without_sentry_dsn_nothing_of_sentry_is_imported(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from shop import create_app
        create_app({{"SECRET_KEY": "x", "DATABASE_URL": "sqlite:///{tmp_path}/r.sqlite3"}}, env={{}})
        print("sentry_sdk" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_sentry_dsn_without_the_extra_installed_is_a_configuration_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentry_sdk", None)  # as if `backstop[sentry]` was not installed
    with pytest.raises(SettingsError) as refused:
        create_app(
            {"SECRET_KEY": "x", "DATABASE_URL": f"sqlite:///{tmp_path}/r.sqlite3"},
            env={"SENTRY_DSN": "https://key@sentry.example/1"},
        )
    assert refused.value.variable == "SENTRY_DSN" and "backstop[sentry]" in str(refused.value)


class _Collector(BaseHTTPRequestHandler):
    """Sentry's ingest endpoint, as far as the SDK needs it: every envelope's items, kept."""

    received: list[dict] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = self.headers.get("Content-Encoding")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "br":
            import brotli

            body = brotli.decompress(body)
        for line in body.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                self.received.append(item)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def sentry_server():
    pytest.importorskip("sentry_sdk", reason="the sentry extra is not installed (pip install -e '.[sentry]')")
    import sentry_sdk

    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    start_thread(server.serve_forever)
    try:
        yield server
    finally:
        sentry_sdk.get_client().close(timeout=2)
        sentry_sdk.init()  # no DSN: whatever the integrations still see goes nowhere
        server.shutdown()
        server.server_close()


def test_a_requests_error_reaches_sentry_tagged_with_its_order_and_request(make_shop, sentry_server):
    import sentry_sdk

    from shop.store import order_store

    dsn = f"http://publickey@127.0.0.1:{sentry_server.server_address[1]}/1"
    shop = make_shop(SENTRY_DSN=dsn)

    def broken(ref):
        order_store.read_by_reference(ref)  # what a route does first; the log context learns the order
        raise RuntimeError("the view broke after reading the order")

    shop.add_url_rule("/test-broken/<ref>", "test_broken", broken)
    shopper = Shopper(shop)
    ref = shopper.buy()
    answer = shopper.client.get(f"/test-broken/{ref}", headers={"X-Request-ID": "broken-1"})
    assert answer.status_code == 500  # in words, as every unexpected error (shop.errors)
    sentry_sdk.flush(timeout=5)

    events = wait_until(
        lambda: [item for item in _Collector.received if item.get("exception")], 5, "an error report with its exception"
    )
    # One report (the Flask integration's, with its request; the log line's copy is deduplicated).
    (event,) = events
    assert event["tags"]["order_ref"] == ref and event["tags"]["request_id"] == "broken-1"
    assert event["request"]["url"].endswith(f"/test-broken/{ref}")
    assert [value["type"] for value in event["exception"]["values"]] == ["RuntimeError"]


def failing_job(ref: str) -> None:
    """A worker's job that breaks while it works on an order (as shop.jobs scope theirs)."""
    from shop import logs

    with logs.scope(job_id="job-under-test"):
        logs.learn(order_ref=ref)
        raise RuntimeError("the job broke while working on the order")


def test_a_worker_jobs_error_reaches_sentry_through_the_rq_integration_tagged_with_its_order(
    make_fresh_app, sentry_server, redis_conn
):
    import uuid

    import sentry_sdk
    from rq import Queue, SimpleWorker

    dsn = f"http://publickey@127.0.0.1:{sentry_server.server_address[1]}/1"
    make_fresh_app(SENTRY_DSN=dsn)  # what `flask shop worker` does first: build the app, which starts reporting
    queue = Queue(f"sentry-test-{uuid.uuid4().hex[:8]}", connection=redis_conn)
    job = queue.enqueue(f"{__name__}.failing_job", "BK-JQBBRQKE")

    class Worker(SimpleWorker):
        def subscribe(self):
            """No control channel: the test sends the worker no command, and RQ's listening thread,
            which sleeps 60 s between looks, could hold the burst's end for that long (the shop's
            own worker wakes it every second, shop/queue/worker.py)."""

    Worker([queue], connection=redis_conn).work(burst=True)
    assert job.get_status(refresh=True) == "failed"
    sentry_sdk.flush(timeout=5)

    events = wait_until(
        lambda: [item for item in _Collector.received if item.get("exception")], 5, "an error report with its exception"
    )
    event = events[0]
    assert [value["type"] for value in event["exception"]["values"]] == ["RuntimeError"]
    assert event["tags"]["order_ref"] == "BK-JQBBRQKE"
    assert event["extra"]["rq-job"]["job_id"] == job.id  # the RQ integration's own account of the job
    queue.delete(delete_jobs=True)


def test_a_report_carries_no_body_local_variable_cookie_authorization_or_secret_of_the_query(make_shop, sentry_server):
    import sentry_sdk
    from flask import request

    dsn = f"http://publickey@127.0.0.1:{sentry_server.server_address[1]}/1"
    shop = make_shop(SENTRY_DSN=dsn)

    def broken():
        held_in_a_local = "-".join(("local", "secret", "9f3a"))  # built, so not in the source shown
        request.get_data()  # the view read its body, as a form or a webhook does
        raise RuntimeError(f"broke holding {len(held_in_a_local)} characters")

    from shop.extensions import csrf

    shop.add_url_rule("/test-leaky", "test_leaky", csrf.exempt(broken), methods=["POST"])
    client = shop.test_client()
    client.set_cookie("session", "cookie-secret-77c1")
    answer = client.post(
        "/test-leaky?token=token-secret-1b2c&session_id=cs_test_sessionsecret42&page=2&note=sk_test_keysecret99",
        data={"password": "body-secret-5e6f"},
        headers={"Authorization": "Bearer auth-secret-0d9e", "X-Request-ID": "leaky-1"},
    )
    assert answer.status_code == 500
    sentry_sdk.flush(timeout=5)

    (event,) = wait_until(
        lambda: [item for item in _Collector.received if item.get("exception")], 5, "an error report with its exception"
    )
    sent = json.dumps(event)
    secrets = (
        "local-secret",
        "body-secret",
        "cookie-secret",
        "auth-secret",
        "token-secret",
        "sessionsecret",
        "keysecret",
    )
    for secret in secrets:
        assert secret not in sent, f"{secret} reached Sentry"
    assert event["tags"]["request_id"] == "leaky-1"  # the report still says which request it was
    assert "page=2" in event["request"]["query_string"]  # and what is not secret of its query
