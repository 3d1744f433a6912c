"""OpenTelemetry, wired in (docs/REFERENCE.md, Tracing; the `otel` extra). Imported by create_app
only when the extra is installed and the OTEL_* variables ask for spans (shop.traces.wanted): a shop
without either loads nothing of OpenTelemetry.

Configured by the standard variables, read by the SDK itself: OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES (the resource), OTEL_TRACES_EXPORTER (`otlp`, the default, and/or
`console`), OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (OTLP over HTTP with
protobuf, the one protocol the extra ships), OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_* (the batch
span processor) and OTEL_TRACES_SAMPLER.

What is traced: the web's requests (Flask; /healthz, /metrics and /static left out unless
OTEL_PYTHON_FLASK_EXCLUDED_URLS says otherwise), SQL (psycopg: the SQLAlchemy instrumentation of
this release refuses SQLAlchemy 2.1, so a SQLite shop has no SQL spans), Redis, and the provider's
calls (requests, which the stripe SDK's transport uses here: provider.transport); and the shop's
own spans through shop.traces. Without OTEL_TRACES_SAMPLER, a span that would start a trace of its
own as a lone client call (a worker's Redis poll, a scheduler's SQL poll) is not recorded: the
traces are the requests' and the jobs', not a poll every second."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import traces
from .reporting import scrub_url
from .settings import SettingsError

log = logging.getLogger("shop.tracing")

_KINDS = {traces.INTERNAL: SpanKind.INTERNAL, traces.CONSUMER: SpanKind.CONSUMER, traces.PRODUCER: SpanKind.PRODUCER}
_PROPAGATOR = TraceContextTextMapPropagator()
EXCLUDED_URLS = "/healthz,/metrics,/static/"
OTLP_PROTOCOL = "http/protobuf"
_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_lock = threading.Lock()
_process: _OtelTracer | None = None


class _NoLoneClientCalls(Sampler):
    """The root sampler: a client call (SQL, Redis, an HTTP request out) outside any span is not
    recorded; every other root span is."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        if kind == SpanKind.CLIENT:
            return SamplingResult(Decision.DROP)
        return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return "NoLoneClientCalls"


def _context_of(traceparent: str):
    return _PROPAGATOR.extract({"traceparent": traceparent})


class _OtelTracer:
    """shop.traces' tracer, on OpenTelemetry's SDK."""

    def __init__(self, provider: TracerProvider, where: str):
        self.provider = provider
        self.tracer = provider.get_tracer("backstop")
        self.where = where

    def traceparent(self) -> str | None:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier.get("traceparent")

    def trace_id(self) -> str | None:
        found = trace.get_current_span().get_span_context()
        return f"{found.trace_id:032x}" if found.is_valid else None

    def span(self, name: str, kind: str, parent: str | None, links: Iterable[str], attributes: Mapping[str, Any]):
        linked = [Link(trace.get_current_span(_context_of(tp)).get_span_context()) for tp in links]
        return self.tracer.start_as_current_span(
            name,
            context=_context_of(parent) if parent else None,
            kind=_KINDS.get(kind, SpanKind.INTERNAL),
            links=[link for link in linked if link.context.is_valid],
            attributes=dict(attributes),
        )

    def note(self, attributes: Mapping[str, Any]) -> None:
        current = trace.get_current_span()
        if current.is_recording():
            current.set_attributes({f"backstop.{k}": v for k, v in attributes.items()})

    def describe(self) -> str:
        return f"on: service {self.provider.resource.attributes.get('service.name')}, exporting to {self.where}"


def _exporters(env: Mapping[str, str]) -> tuple[list, str]:
    """The exporters OTEL_TRACES_EXPORTER names (OTLP when unset), and where they send, in words."""
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    unknown = [n for n in names if n not in ("otlp", "console", "none")]
    if unknown:
        names_given = ", ".join(unknown)
        raise SettingsError("OTEL_TRACES_EXPORTER", f"names {names_given}: the otel extra exports otlp or console")
    exporters, where = [], []
    if "otlp" in names:
        variable = next((v for v in _PROTOCOL_VARIABLES if env.get(v)), None)
        protocol = env[variable] if variable else OTLP_PROTOCOL
        if variable and protocol != OTLP_PROTOCOL:
            raise SettingsError(variable, f"is {protocol}: the otel extra sends {OTLP_PROTOCOL} only")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        exporters.append(exporter)
        where.append(f"{exporter._endpoint} (OTLP {OTLP_PROTOCOL})")
    if "console" in names:
        exporters.append(ConsoleSpanExporter())
        where.append("the console (stdout)")
    return exporters, " and ".join(where) or "nowhere (OTEL_TRACES_EXPORTER=none)"


def _provider(env: Mapping[str, str]) -> _OtelTracer:
    """This process's tracer provider, made once (OpenTelemetry's global can be set once)."""
    global _process
    with _lock:
        if _process is not None:
            return _process
        exporters, where = _exporters(env)
        sampler = None if env.get("OTEL_TRACES_SAMPLER") else ParentBased(root=_NoLoneClientCalls())
        # A sampler of None is OTEL_TRACES_SAMPLER's.
        provider = TracerProvider(resource=_resource(), sampler=sampler)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _instrument_clients()
        _process = _OtelTracer(provider, where)
        return _process


def _resource() -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (read by the SDK); `backstop` for a service
    they leave unnamed."""
    found = Resource.create()
    if str(found.attributes.get("service.name", "")).startswith("unknown_service"):
        return found.merge(Resource({"service.name": "backstop"}))
    return found


def _instrument_clients() -> None:
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    PsycopgInstrumentor().instrument(enable_commenter=False)
    RedisInstrumentor().instrument()
    RequestsInstrumentor().instrument(response_hook=_scrub_span)


_URL_ATTRIBUTES = ("http.url", "url.full", "http.target")


def _scrub(span) -> None:
    """A URL's query may open something (an order's private link, `token=`): hidden, as the
    error reports hide it (shop.reporting)."""
    attributes = getattr(span, "attributes", None) or {}
    for name in _URL_ATTRIBUTES:
        value = attributes.get(name)
        if isinstance(value, str) and "?" in value:
            span.set_attribute(name, scrub_url(value))
    query = attributes.get("url.query")
    if isinstance(query, str) and query:
        span.set_attribute("url.query", scrub_url("?" + query).lstrip("?"))


def _scrub_span(span, *_answer) -> None:
    """Flask's and requests' response hook: the span's attributes are all set by then."""
    if span is not None and span.is_recording():
        _scrub(span)


def init_tracing(app, env: Mapping[str, str] | None = None) -> None:
    """Spans for this app's requests, and the process's tracer (made by the first app of the
    process) installed where the shop calls it (shop.traces)."""
    env = os.environ if env is None else env
    tracer = _provider(env)
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    FlaskInstrumentor.instrument_app(
        app,
        response_hook=_scrub_span,
        excluded_urls=env.get("OTEL_PYTHON_FLASK_EXCLUDED_URLS") or EXCLUDED_URLS,
        enable_commenter=False,
    )
    traces.install(tracer)
    log.info("tracing %s", tracer.describe())
