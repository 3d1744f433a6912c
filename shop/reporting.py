"""Error reports to Sentry (docs/REFERENCE.md, Settings: SENTRY_DSN; the `sentry` extra).

Imported by create_app only when SENTRY_DSN is set, so a shop without it loads nothing of
sentry-sdk. Every process that builds the app reports: the web (sentry-sdk's Flask integration:
a request's unhandled error), the workers (its RQ integration: a job's), and the scheduler and
CLI commands through the logging integration (an ERROR line, such as a dead letter, becomes an
event). Each event is tagged with what the log context knows where it happened (shop.logs): the
order's reference (`order_ref`), the request id, the job, the delivery or command, so a report
leads to the same lines `LOG_FORMAT=json` writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import logs
from .settings import SettingsError

if TYPE_CHECKING:
    from sentry_sdk._types import Event, Hint


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
        before_send=_tag_with_log_context,
        server_name=app.config.get("NODE_NAME") or None,
        # Errors only: no performance tracing. (Request bodies and cookies, which carry order
        # links and sessions, stay out: sentry-sdk's default, not sending personal data.)
        traces_sample_rate=None,
    )
