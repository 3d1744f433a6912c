"""Log lines and what they know (docs/REFERENCE.md, Logs).

`LOG_FORMAT=text` (the default, for people) keeps the one-line format every process has always
written (`node.LOG_FORMAT_TEXT`); `LOG_FORMAT=json` writes one JSON object per line (python-json-
logger): `time`, `level`, `logger`, `message`, `node`, and whichever of the context's fields are
known where the line was logged.

The context is one contextvar holding a small dict, set for a scope and reset when it ends:
  - a web request: `request_id` (an incoming `X-Request-ID` kept, otherwise made; shop.web);
  - an RQ job: `job_id` (queue.worker);
  - a delivery or a command being run: `delivery_id` or `command_id`, `order_id`, and the
    `request_id` of the request whose commit wrote the row (outbox.runner): the writer stores the
    current request id on every delivery and command (outbox.writer), so a worker's lines for the
    work a checkout left carry the checkout's request id, and so does the work that work writes;
  - `order_ref`, learned where an order is read or placed (store.order_store).
One set and one reset per scope; a field learned inside a scope (`learn`) is a set that the
scope's reset undoes. Outside any scope nothing is learned, so a long-lived thread never carries
one order's reference into the next one's lines.

With tracing on (shop.traces), every line logged inside a span carries its trace's id: the JSON
format's `trace_id`, the text format's ` trace=<id>` at the end of the message; an order's
reference or id learned in a scope is put on the current span too.

A provider call's line adds its own fields (`endpoint`, `latency_ms`, `outcome`, `status`,
`provider_request_id`, `idempotency_key`; provider.transport) as the record's extras."""

from __future__ import annotations

import logging
import re
import time
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Iterator

from . import traces

TEXT = "text"
JSON = "json"
FORMATS = (TEXT, JSON)

# The context's fields, in the order the reference lists them.
FIELDS = ("request_id", "job_id", "delivery_id", "command_id", "order_id", "order_ref")

_context: ContextVar[dict | None] = ContextVar("backstop_log_context", default=None)


def current() -> dict:
    """The fields known here (empty outside any scope). Do not modify it."""
    return _context.get() or {}


def request_id() -> str | None:
    """The request id this work belongs to: the web request's, or the one the running delivery or
    command was written with. The outbox's writer stores it on what it writes."""
    ctx = _context.get()
    return None if ctx is None else ctx.get("request_id")


def enter(**fields) -> Token[dict | None]:
    """Start a scope with these fields (None values left out) over the enclosing scope's; returns
    the token `leave` takes. For callers whose scope is not one block (a request's hooks)."""
    ctx = _context.get()
    known = {k: v for k, v in fields.items() if v is not None}
    return _context.set({**ctx, **known} if ctx else known)


def leave(token) -> None:
    """Close the scope `enter` opened (`token`: what it returned, which some callers keep as an object)."""
    _context.reset(token)


@contextmanager
def scope(**fields) -> Iterator[None]:
    """These fields (None values left out) on every line logged inside the block."""
    token = enter(**fields)
    try:
        yield
    except BaseException as exc:
        # An error leaving the scope keeps what was known where it happened: an error report made
        # after the scope has closed (RQ's, a job's) still names the order (shop.reporting).
        if getattr(exc, CONTEXT_ATTRIBUTE, None) is None:
            try:
                setattr(exc, CONTEXT_ATTRIBUTE, dict(_context.get() or {}))
            except AttributeError:
                pass  # an exception type without a __dict__: reported without the fields
        raise
    finally:
        _context.reset(token)


CONTEXT_ATTRIBUTE = "backstop_log_context"


def context_of(exc: BaseException | None) -> dict:
    """The fields known where `exc` left its innermost scope, or {}."""
    return getattr(exc, CONTEXT_ATTRIBUTE, None) or {}


def learn(**fields) -> None:
    """Fields found out inside a scope (an order's reference once it is read): on the scope's
    remaining lines, dropped with the scope. Outside any scope, nothing."""
    ctx = _context.get()
    if ctx is not None:
        _context.set({**ctx, **{k: v for k, v in fields.items() if v is not None}})
    if traces.on():
        traces.note(**{k: v for k, v in fields.items() if k in ("order_ref", "order_id")})


class ContextFilter(logging.Filter):
    """Puts the context's fields on each record the handler formats (a field passed as an extra
    wins). A handler filter runs in the thread that logged, where the context is."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get()
        if ctx:
            attrs = record.__dict__
            for key, value in ctx.items():
                attrs.setdefault(key, value)
        trace_id = traces.trace_id()
        if trace_id is not None:
            record.__dict__.setdefault("trace_id", trace_id)
        return True


# C0 and C1 controls, DEL, and the line and paragraph separators: anything that ends a line
# somewhere or rewrites a terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match) -> str:
    n = ord(match.group())
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def escaped(text: str) -> str:
    """`text` with every control character written as its escape (a newline as `\\x0a`) and `\\`
    as `\\\\`: a line read back says what was sent, and a client's `%0a` starts no line of its own."""
    return _CONTROL.sub(_escape, text.replace("\\", "\\\\"))


class _OneLine(logging.Formatter):
    """The text format with the message's control characters escaped (a traceback, added after
    it, keeps its lines). The JSON format needs none: JSON escapes them."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message)
        trace_id = getattr(record, "trace_id", None)
        if isinstance(trace_id, str):
            record.message += f" trace={trace_id}"
        return super().formatMessage(record)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of LOG_FORMAT. JSON: python-json-logger, with every extra on the record (the
    node, the context's fields, a provider call's fields) as a key of its own."""
    from .node import LOG_FORMAT_TEXT

    if log_format != JSON:
        return _OneLine(LOG_FORMAT_TEXT)
    from pythonjsonlogger.json import JsonFormatter

    made = JsonFormatter(
        ["asctime", "levelname", "name", "message"],
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
    )
    # `time` first, ISO 8601 in UTC to the millisecond: 2026-12-02T14:15:06.141Z.
    made.converter = time.gmtime
    made.default_time_format = "%Y-%m-%dT%H:%M:%S"
    made.default_msec_format = "%s.%03dZ"
    return made


def handler(log_format: str, stream=None) -> logging.Handler:
    """A stream handler (stderr unless given) writing LOG_FORMAT's lines, the context included."""
    made = logging.StreamHandler(stream)
    made.setFormatter(formatter(log_format))
    made.addFilter(ContextFilter())
    return made


# The mark configure() leaves on the handler it adds to a stdlib logger, to find it again.
_OURS = "backstop"


def configure(log_format: str) -> None:
    """The process's log lines: a handler of ours on the root logger, at INFO, as
    logging.basicConfig would add one; a later app of another format switches its formatter.
    When something else configured the root logger first (a test runner, a host with its own
    logging), it is left alone, as basicConfig leaves it."""
    root = logging.getLogger()
    ours = next((h for h in root.handlers if getattr(h, _OURS, False)), None)
    if ours is None:
        if root.handlers:
            return
        ours = handler(log_format)
        setattr(ours, _OURS, True)
        root.addHandler(ours)
        root.setLevel(logging.INFO)
        return
    ours.setFormatter(formatter(log_format))
