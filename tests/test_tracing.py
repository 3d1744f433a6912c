"""Tracing's switch and what it leaves where (docs/REFERENCE.md, Tracing). Each case runs in a
Python process of its own: OpenTelemetry's tracer provider is set once per process, and the first
cases are about what a process never imports.

- without OTEL_* variables the shop loads nothing of its tracing wiring, even with the extra
  installed; without the extra, the variables change nothing but a warning;
- with them (the console exporter), a row written inside a span stores that span's traceparent
  beside the request id, the delivery that runs it is that span's child, and log lines carry the
  trace id; `flask shop check` says where spans go."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from process_support import ROOT, flask_command, process_env

NEEDS_OTEL = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import opentelemetry.sdk"], capture_output=True).returncode != 0,
    reason="the otel extra is not installed (pip install -e '.[otel]')",
)


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _without_otel(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")}


# What OpenTelemetry's wiring would load: the shop's own module, the instrumentations, an exporter, the
# tracing SDK. (redis-py 8 imports opentelemetry.sdk.metrics by itself wherever the SDK is installed:
# that much is redis-py's, with or without the variables.)
WIRING = ("shop.tracing", "opentelemetry.instrumentation", "opentelemetry.exporter", "opentelemetry.sdk.trace")

_A_DAY_OF_WORK = """
    import json, sys
    from shop import create_app, traces
    from shop.extensions import db
    from shop.outbox import dispatch

    app = create_app()
    assert app.test_client().get("/").status_code == 200
    with app.app_context():
        dispatch.drain_deliveries()
        db.session.remove()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "shop"))
    print("RESULT " + json.dumps({"loaded": loaded, "on": traces.on(), "traceparent": traces.traceparent()}))
"""

# A process without the extra: every import of OpenTelemetry fails, as where it is not installed.
_NO_EXTRA = """
    import importlib.abc, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NotInstalled())
"""


def _result(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(next(l for l in run.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT ") :])


def test_without_otel_variables_the_shop_loads_nothing_of_the_tracing_wiring(fresh_app):
    found = _result(_run(_A_DAY_OF_WORK, _without_otel(process_env(fresh_app))))
    assert (found["on"], found["traceparent"]) == (False, None)
    assert [m for m in found["loaded"] if m.startswith(WIRING)] == []


def test_without_the_extra_the_variables_change_nothing_but_a_warning(fresh_app):
    env = {**_without_otel(process_env(fresh_app)), "OTEL_TRACES_EXPORTER": "console"}
    run = _run(textwrap.dedent(_NO_EXTRA) + textwrap.dedent(_A_DAY_OF_WORK), env)
    found = _result(run)
    assert found == {"loaded": [m for m in found["loaded"] if m.startswith("shop")], "on": False, "traceparent": None}
    assert "shop.tracing" not in found["loaded"]
    assert "OTEL_* variables ask for traces but the otel extra cannot be loaded" in run.stderr


@NEEDS_OTEL
def test_a_row_written_in_a_span_keeps_its_traceparent_and_its_delivery_runs_as_that_spans_child(fresh_app):
    env = {
        **_without_otel(process_env(fresh_app)),
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "tracing-test",
        "LOG_FORMAT": "json",
    }
    run = _run(
        """
        import io, json, logging
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry import trace
        from shop import create_app, logs, traces
        from shop.extensions import db
        from shop.models import ScheduledCommand
        from shop.outbox import dispatch, uow
        from shop.outbox.writer import schedule_command
        from shop.models import CommandKind
        from shop.domain.deadlines import utcnow

        app = create_app()
        kept = InMemorySpanExporter()
        trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(kept))
        with app.app_context():
            with traces.span("writer"):
                written = traces.traceparent()
                with uow.transaction() as session:
                    command = schedule_command(session, CommandKind.SEND_EMAIL, utcnow(), payload={"template": "x"})
                logging.getLogger("shop").warning("written in the writer's span")
                text = io.StringIO()
                as_text = logging.getLogger("tracing-test.text")
                as_text.addHandler(logs.handler("text", text))
                as_text.warning("and in text")
            stored = db.session.get(ScheduledCommand, command).traceparent
            db.session.remove()
            returned = dispatch.run_command(command)
        spans = {s.name: s for s in kept.get_finished_spans()}
        ran = spans["process send_email"]
        writer = spans["writer"]
        print("RESULT " + json.dumps({
            "returned": str(returned),
            "written": written,
            "stored": stored,
            "writer": [f"{writer.context.trace_id:032x}", f"{writer.context.span_id:016x}"],
            "ran": [f"{ran.context.trace_id:032x}", f"{ran.parent.span_id:016x}", ran.kind.name],
            "outcome": ran.attributes.get("backstop.outcome"),
            "text": text.getvalue(),
        }))
        """,
        env,
    )
    found = _result(run)
    trace_id, span_id = found["writer"]
    assert found["written"] == found["stored"]
    assert found["stored"].startswith(f"00-{trace_id}-{span_id}-")  # and its flags (sampled, ...)
    # The command's span is the writer's child, in the writer's trace (not a trace of its own).
    assert found["ran"] == [trace_id, span_id, "CONSUMER"]
    assert found["outcome"] == found["returned"]  # what came of it, on its span
    # The line logged inside the span carries the trace's id.
    line = next(json.loads(l) for l in run.stderr.splitlines() if "written in the writer's span" in l)
    assert line["trace_id"] == trace_id
    assert found["text"].rstrip().endswith(f"and in text trace={trace_id}")


@NEEDS_OTEL
def test_check_says_tracing_is_on_and_where_it_exports(fresh_app):
    env = {**_without_otel(process_env(fresh_app)), "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "shop-a"}
    run = subprocess.run(
        flask_command() + ["--app", "app", "shop", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next(l for l in run.stdout.splitlines() if "tracing:" in l)
    assert line == "ok    tracing: on: service shop-a, exporting to the console (stdout)", run.stdout

    env = {
        **_without_otel(process_env(fresh_app)),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_SERVICE_NAME": "shop-b",
    }
    run = subprocess.run(
        flask_command() + ["--app", "app", "shop", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next(l for l in run.stdout.splitlines() if "tracing:" in l)
    assert line == (
        "ok    tracing: on: service shop-b, exporting to http://127.0.0.1:4318/v1/traces (OTLP http/protobuf)"
    ), run.stdout


@NEEDS_OTEL
def test_an_exporter_the_extra_does_not_ship_stops_the_process_naming_the_variable(fresh_app):
    env = {
        **_without_otel(process_env(fresh_app)),
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_TRACES_EXPORTER": "otlp",
    }
    run = subprocess.run(
        flask_command() + ["--app", "app", "shop", "worker", "--burst"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in run.stderr and "http/protobuf" in run.stderr, run.stderr


@pytest.mark.parametrize(
    ("env", "wanted", "line"),
    [
        ({}, False, "off (no OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT set)"),
        ({"OTEL_SERVICE_NAME": "web"}, False, "off (no OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT set)"),
        ({"OTEL_TRACES_EXPORTER": "none"}, False, "off (OTEL_TRACES_EXPORTER=none)"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"},
            False,
            "off (OTEL_SDK_DISABLED=true)",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True, None),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True, None),
        ({"OTEL_TRACES_EXPORTER": "console, none"}, True, None),
    ],
)
def test_which_variables_turn_tracing_on_and_what_the_check_says_when_it_is_off(env, wanted, line):
    from shop import traces

    assert traces.wanted(env) is wanted
    if line is not None:
        assert traces.describe(env) == (False, line)
