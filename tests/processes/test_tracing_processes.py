"""One order followed across processes with OpenTelemetry (docs/REFERENCE.md, Tracing): the
Procfile's web, a worker and a scheduler, each with the `otel` extra and the standard OTEL_*
variables pointing at a local OTLP/HTTP receiver (decoded with the opentelemetry-proto package's
ExportTraceServiceRequest), and the sandbox as the provider.

The order is placed and paid while no worker runs, as when every worker is busy or down: its
deliveries wait, and every scheduler poll wakes a drain for them. Then a worker starts and runs
them. The checkout's trace holds the web's request, its SQL, Redis and provider calls, and the
worker's span for the delivery the checkout wrote (a child of the request's span, through the
traceparent stored on the row); the scheduler's poll that woke a drain for it is linked to it, and
the drain job that ran it is linked to what queued it."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

pytest.importorskip("opentelemetry.proto", reason="the otel extra is not installed (pip install -e '.[otel]')")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from factories import seed_catalog_rows  # noqa: E402
from payment_helpers import Shopper, wait_for_status  # noqa: E402
from process_support import Processes, free_port, process_env, start_web  # noqa: E402
from support import wait_until  # noqa: E402

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    links: tuple[tuple[str, str], ...]
    attributes: dict = field(hash=False)


def _value(any_value):
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


def _decoded(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    Span(
                        service=str(resource.get("service.name")),
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                    )
                )
    return found


class Receiver:
    """An OTLP/HTTP trace receiver on a free loopback port: every span it was sent, decoded."""

    def __init__(self):
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    spans = _decoded(body)
                    with receiver.lock:
                        receiver.spans.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of(self, service: str, name: str | None = None, trace_id: str | None = None) -> list[Span]:
        with self.lock:
            return [
                s
                for s in self.spans
                if s.service == service
                and (name is None or s.name == name)
                and (trace_id is None or s.trace_id == trace_id)
            ]


def _otel_env(receiver: Receiver, service: str) -> dict:
    return dict(
        OTEL_SERVICE_NAME=service,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        # Spans leave each process a fifth of a second after they end, not every 5 s.
        OTEL_BSP_SCHEDULE_DELAY="200",
    )


def test_one_order_is_followed_from_the_web_through_the_scheduler_to_the_worker_in_one_trace(
    make_fresh_app, sandbox, is_postgres
):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url)
    skus = seed_catalog_rows(app)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs = Processes()
    # A pay-by far beyond the test: the order waits for its worker, it is not cancelled meanwhile.
    env = process_env(app, window=300, STRIPE_API_BASE=sandbox.base_url)
    with Receiver() as receiver:
        try:
            start_web(procs, {**env, **_otel_env(receiver, "web"), "PORT": str(port), "WEB_CONCURRENCY": "1"})
            procs.start("scheduler", ["shop", "scheduler"], {**env, **_otel_env(receiver, "scheduler")})
            wait_until(lambda: _answers(base), 60, "the web", procs.logs)

            shopper = Shopper.over_http(base, skus)
            order = shopper.place()
            session_id = order["payment"]["session_id"]
            sandbox.set_outcome(session_id, "paid")
            assert shopper.come_back(order["reference"], session_id).status_code in (200, 303)
            wait_for_status(shopper, order["reference"], "Paid", timeout=20)

            # The web: the checkout's request span, and inside its trace the provider call that
            # created the payment session, Redis (the drain woken after the commit) and, on
            # PostgreSQL, the SQL.
            checkout = wait_until(lambda: receiver.of("web", "POST /checkout"), 20, "the checkout's span")[0]
            in_checkout = receiver.of("web", trace_id=checkout.trace_id)
            assert any(s.attributes.get("db.system") == "redis" for s in in_checkout), in_checkout
            assert any("/v1/checkout/sessions" in str(s.attributes.get("http.url", "")) for s in in_checkout), [
                s.attributes for s in in_checkout
            ]
            if is_postgres:
                assert any(s.attributes.get("db.system") == "postgresql" for s in in_checkout)
            # No worker yet: the scheduler's poll wakes a drain for the waiting deliveries, in a
            # span linked to the checkout that wrote one of them.
            wake = wait_until(
                lambda: [
                    s for s in receiver.of("scheduler", "wake drains") if checkout.trace_id in {t for t, _ in s.links}
                ],
                20,
                "the scheduler's poll linked to the checkout",
                procs.logs,
            )[0]
            assert "deliveries" in wake.attributes["backstop.woke"]

            procs.start("worker", ["shop", "worker"], {**env, **_otel_env(receiver, "worker")})
            # The worker: the order-placed email's delivery, a child of the checkout's request span.
            delivered = wait_until(
                lambda: receiver.of("worker", "process send_order_placed_email", trace_id=checkout.trace_id),
                30,
                "the worker's span in the checkout's trace",
                procs.logs,
            )[0]
            assert delivered.parent_span_id == checkout.span_id
            assert delivered.attributes["messaging.destination.name"] == "send_order_placed_email"
            assert delivered.attributes["backstop.outcome"] == "done"
            # ... run in a drain batch whose span links to every row's writer, the checkout among them.
            batch = wait_until(
                lambda: [
                    s
                    for s in receiver.of("worker", "drain outbox_deliveries")
                    if (s.trace_id, s.span_id) in delivered.links
                ],
                20,
                "the drain batch's span",
            )[0]
            assert checkout.trace_id in {t for t, _ in batch.links}
            # ... inside the drain job that ran it, linked to what queued the job: a commit's request
            # in the web (the checkout's or the return page's) or a poll of the scheduler.
            job = wait_until(
                lambda: [s for s in receiver.of("worker", "drain deliveries job") if s.span_id == batch.parent_span_id],
                20,
                "the drain job's span",
            )[0]
            wakers = {(s.trace_id, s.span_id) for s in receiver.of("web") + receiver.of("scheduler", "wake drains")}
            assert job.links and set(job.links) <= wakers, (job.links, wakers)
            # The confirmation, written by the return page's request, joins that request's trace.
            returned = wait_until(lambda: receiver.of("web", "GET /checkout/return"), 20, "the return page's span")[0]
            confirmed = wait_until(
                lambda: receiver.of("worker", "process send_order_confirmation", trace_id=returned.trace_id),
                30,
                "the confirmation's span in the return page's trace",
                procs.logs,
            )[0]
            assert confirmed.parent_span_id == returned.span_id
        finally:
            procs.stop()


def _answers(base: str) -> bool:
    try:
        return requests.get(base + "/", timeout=2).status_code == 200
    except requests.RequestException:
        return False
