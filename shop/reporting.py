"""Error reports to Sentry (docs/REFERENCE.md, Settings: SENTRY_DSN; the `sentry` extra).

Imported by create_app only when SENTRY_DSN is set, so a shop without it loads nothing of
sentry-sdk. Every process that builds the app reports: the web (sentry-sdk's Flask integration:
a request's unhandled error), the workers (its RQ integration: a job's), and the scheduler and
CLI commands through the logging integration (an ERROR line, such as a dead letter, becomes an
event). Each event is tagged with what the log context knows where it happened (shop.logs): the
order's reference (`order_ref`), the request id, the job, the delivery or command, so a report
leads to the same lines `LOG_FORMAT=json` writes.

What leaves for Sentry is said in REFERENCE (Settings, SENTRY_DSN): no request body, no local
variables, no personal data, and `_scrub` hides what could open something private anyway: a
query's `token=` (an order's private link), a provider session id, anything named or shaped like
a key, cookies and the Authorization header, wherever the SDK put them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import logs
from .settings import SettingsError

if TYPE_CHECKING:
    from sentry_sdk._types import Event, Hint


HIDDEN = "[hidden]"
# A query field or header whose value opens something: by its name ...
_SECRET_NAME = re.compile(r"token|session|secret|key|passw|signature|auth|cookie|csrf|dsn", re.IGNORECASE)
# ... or by its shape: the provider's keys, signing secrets and session ids, a bearer token.
_SECRET_VALUE = re.compile(r"\b(?:sk|rk|pk|whsec|cs|seti|pi)_[A-Za-z0-9_]{6,}|\bBearer\s+\S+", re.IGNORECASE)


def scrub_query(query: str) -> str:
    """`query` with the value of every field named like a secret hidden, and anything shaped like
    a key hidden in the others (a query that does not parse is hidden whole)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return HIDDEN if query else query
    return urlencode(
        [(k, HIDDEN if _SECRET_NAME.search(k) else _SECRET_VALUE.sub(HIDDEN, v)) for k, v in pairs], safe="[]"
    )


def scrub_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query=scrub_query(parts.query), fragment=""))


def _scrub_request(request: dict) -> None:
    request.pop("data", None)  # a body: an order's address, an operator's password, a webhook's event
    request.pop("cookies", None)
    if isinstance(request.get("query_string"), str):
        request["query_string"] = scrub_query(request["query_string"])
    if isinstance(request.get("url"), str):
        request["url"] = scrub_url(request["url"])
    headers = request.get("headers")
    if isinstance(headers, dict):
        request["headers"] = {
            k: HIDDEN if _SECRET_NAME.search(k) else _SECRET_VALUE.sub(HIDDEN, str(v)) for k, v in headers.items()
        }
    env = request.get("env")
    if isinstance(env, dict):
        request["env"] = {k: v for k, v in env.items() if k in ("SERVER_NAME", "SERVER_PORT")}


def _scrub_breadcrumbs(event: dict) -> None:
    crumbs = event.get("breadcrumbs")
    values = crumbs.get("values") if isinstance(crumbs, dict) else crumbs
    for crumb in values if isinstance(values, list) else ():
        if isinstance(crumb.get("message"), str):
            crumb["message"] = _SECRET_VALUE.sub(HIDDEN, crumb["message"])
        data = crumb.get("data")
        if isinstance(data, dict):
            for name in ("url", "http.query"):
                if isinstance(data.get(name), str):
                    data[name] = scrub_url(data[name]) if name == "url" else scrub_query(data[name])


def _scrub(event: Event) -> Event:
    """What a report carries of a request and of the lines before it, with every secret hidden."""
    if isinstance(event.get("request"), dict):
        _scrub_request(event["request"])  # type: ignore[arg-type]  # a TypedDict the SDK fills freely
    _scrub_breadcrumbs(event)  # type: ignore[arg-type]
    return event


def _scrub_breadcrumb(crumb, _hint):
    _scrub_breadcrumbs({"breadcrumbs": [crumb]})
    return crumb


def _before_send(event: Event, hint: Hint) -> Event:
    return _scrub(_tag_with_log_context(event, hint))


def _tag_with_log_context(event: Event, _hint: Hint) -> Event:
    """before_send: runs in the thread that captured the event, where the log context is."""
    exc_info = _hint.get("exc_info") if isinstance(_hint, dict) else None
    # Where the error happened, if it left a scope before being reported; then what is known here.
    known = {**logs.context_of(exc_info[1] if exc_info else None), **logs.current()}
    if known:
        tags = event.setdefault("tags", {})
        for key in logs.FIELDS:
            value = known.get(key)
            if value is not None:
                tags.setdefault(key, str(value))
    return event


def _no_personal_data(sentry_sdk) -> dict:
    """`send_default_pii=False`, said the way the installed SDK takes it: the SDKs that know
    `data_collection` call the old flag deprecated (and ignore it beside the new one)."""
    import inspect

    from sentry_sdk.consts import ClientConstructor

    if "data_collection" not in inspect.signature(ClientConstructor.__init__).parameters:
        return {"send_default_pii": False}
    off = {"mode": "off"}
    return {
        "data_collection": {
            "user_info": False,
            "cookies": off,
            "http_headers": {"request": {"mode": "denylist"}},
            "http_bodies": [],
            "url_query_params": {"mode": "denylist"},
            "database_query_data": False,
            "stack_frame_variables": False,
        }
    }


def init_error_reporting(app) -> None:
    try:
        import sentry_sdk
        from sentry_sdk.integrations.flask import FlaskIntegration
        from sentry_sdk.integrations.rq import RqIntegration
    except ImportError as exc:
        raise SettingsError(
            "SENTRY_DSN",
            f"is set but sentry-sdk cannot be imported ({exc}): install the extra, pip install 'backstop[sentry]'",
        ) from None
    sentry_sdk.init(
        dsn=app.config["SENTRY_DSN"],
        integrations=[FlaskIntegration(), RqIntegration()],
        before_send=_before_send,
        before_breadcrumb=_scrub_breadcrumb,
        server_name=app.config.get("NODE_NAME") or None,
        # Errors only: no performance tracing. Request bodies, cookies and local variables carry
        # order links, addresses and sessions: none is sent, whatever the SDK's defaults become.
        traces_sample_rate=None,
        include_local_variables=False,
        max_request_body_size="never",
        **_no_personal_data(sentry_sdk),
    )
