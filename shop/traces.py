"""Tracing's seam (docs/REFERENCE.md, Tracing): what the rest of the shop calls, whether tracing is
on or not. It imports nothing of OpenTelemetry. With the `otel` extra installed and an exporter
named by the standard OTEL_* variables, create_app imports shop.tracing, which installs the real
tracer here (`install`); until then, and in a shop without either, every call below is a no-op
that costs an attribute read, and nothing of OpenTelemetry is ever loaded.

What calls it: the outbox's writer stores `traceparent()` beside the request id on every delivery
and command; the runner runs each row in `span(..., parent=row's traceparent)`, a child of the span
that wrote it, and each drain batch in a span linked to every row's writer; the sweep's passes and
the scheduler's poll have spans of their own; log lines carry `trace_id()` (shop.logs); an order's
reference learned in a scope is put on the current span (`note`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Protocol

# Span kinds, as the callers say them (OpenTelemetry's SpanKind, by name).
INTERNAL = "internal"
CONSUMER = "consumer"
PRODUCER = "producer"

# The variables that name where spans go: any of them (and OTEL_SDK_DISABLED not true) turns
# tracing on where the extra is installed. OTEL_TRACES_EXPORTER=none turns it off.
EXPORT_VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXTRA_DISTRIBUTION = "opentelemetry-sdk"


class Tracer(Protocol):
    def traceparent(self) -> str | None: ...

    def trace_id(self) -> str | None: ...

    def span(
        self, name: str, kind: str, parent: str | None, links: Iterable[str], attributes: Mapping[str, Any]
    ) -> Any: ...

    def note(self, attributes: Mapping[str, Any]) -> None: ...

    def describe(self) -> str: ...


_tracer: Tracer | None = None


def install(tracer: Tracer | None) -> None:
    """shop.tracing's tracer, for the whole process (None: tracing off again, for tests)."""
    global _tracer
    _tracer = tracer


def on() -> bool:
    return _tracer is not None


def wanted(env: Mapping[str, str]) -> bool:
    """Do the OTEL_* variables ask for spans? (Whether the extra is installed is `installed()`.)"""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if exporters:
        return exporters != {"none"}
    return any(env.get(name, "").strip() for name in EXPORT_VARIABLES)


def installed() -> bool:
    """Is the `otel` extra installed? Asked of the package metadata: nothing is imported."""
    try:
        metadata.version(EXTRA_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    return True


def traceparent() -> str | None:
    """The current span's W3C traceparent, for a row written now; None with tracing off or outside
    any span."""
    return None if _tracer is None else _tracer.traceparent()


def trace_id() -> str | None:
    """The current trace's id (32 hex digits), for a log line; None with tracing off or outside any span."""
    return None if _tracer is None else _tracer.trace_id()


@contextmanager
def span(
    name: str,
    *,
    kind: str = INTERNAL,
    parent: str | None = None,
    links: Iterable[str | None] = (),
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[None]:
    """A span around the block: a child of `parent` (a stored traceparent) when given, else of the
    current span; linked to each traceparent of `links`. None-valued attributes are left out."""
    if _tracer is None:
        yield
        return
    known = {k: v for k, v in (attributes or {}).items() if v is not None}
    with _tracer.span(name, kind, parent, [link for link in links if link], known):
        yield


def note(**attributes: Any) -> None:
    """Attributes learned inside the current span (an order's reference once it is read)."""
    if _tracer is not None:
        known = {k: v for k, v in attributes.items() if v is not None}
        if known:
            _tracer.note(known)


def describe(env: Mapping[str, str]) -> tuple[bool, str]:
    """For `flask shop check`: (a warning?, one line saying whether tracing is on and where it exports)."""
    if _tracer is not None:
        return False, _tracer.describe()
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False, "off (OTEL_SDK_DISABLED=true)"
    if not wanted(env):
        said = env.get("OTEL_TRACES_EXPORTER", "").strip()
        return (
            False,
            f"off (OTEL_TRACES_EXPORTER={said})"
            if said
            else "off (no OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT set)",
        )
    if not installed():
        return True, "off: OTEL_* variables are set but the otel extra is not installed (pip install 'backstop[otel]')"
    return False, "off in this process"
