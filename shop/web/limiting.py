"""What the shop's Flask-Limiter throttles share (the console's login, the storefront's return
page and order links form): where a limiter keeps its counts, a limiter for one view, and the 429
that refuses a request past a limit, with its wait in words."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

from flask import Response, current_app, jsonify, request
from flask_limiter import Limiter, RequestLimit

from ..settings_values import parse_sentinel_url
from .answers import wants_json


def wait_in_words(seconds: float) -> str:
    if seconds < 60:
        n = max(1, math.ceil(seconds))
        return f"{n} second{'s' if n != 1 else ''}"
    n = math.ceil(seconds / 60)
    return f"{n} minute{'s' if n != 1 else ''}"


def limiter_storage(redis_url: str) -> tuple[str, dict]:
    """The limiter's storage URI and options for REDIS_URL. limits names a Unix socket
    `redis+unix://` (the shop's REDIS_URL accepts `unix://`), and reads the path of a Sentinel URL
    as the service name only: the shop's `/SERVICE/DB` goes as the URI's service and a `db` option."""
    options = {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}
    if redis_url.startswith("unix://"):
        return "redis+unix://" + redis_url.removeprefix("unix://"), options
    if redis_url.startswith("redis+sentinel://"):
        where = parse_sentinel_url(redis_url)
        sentinels = ",".join(f"{host}:{port}" for host, port in where.sentinels)
        uri = f"redis+sentinel://{sentinels}/{where.service}"
        auth = {k: v for k, v in (("username", where.username), ("password", where.password)) if v}
        return uri, {**options, **auth, "db": where.db, "sentinel_kwargs": dict(options)}
    return redis_url, options


def shop_limiter(app, key_func, name: str) -> Limiter:
    """A Flask-Limiter on this app's Redis under the app's key prefix plus `name`, counting in fixed
    windows (a window starts at the first hit: the key's expiry), bound to the app. A Redis that
    does not answer costs a request half a second at most, and the limiter then counts in this
    process's memory instead of failing the request."""
    storage_uri, storage_options = limiter_storage(app.config["REDIS_URL"])
    limiter = Limiter(
        key_func=key_func,
        storage_uri=storage_uri,
        storage_options=storage_options,
        strategy="fixed-window",
        key_prefix=f"{app.config['QUEUE_PREFIX']}:{name}",
        swallow_errors=True,
        in_memory_fallback_enabled=True,
    )
    limiter.init_app(app)
    return limiter


def view_limiter(app, endpoint: str, key_func, name: str) -> tuple[Limiter, Callable]:
    """A limiter (shop_limiter) that every request but `endpoint`'s skips at once, and the
    endpoint's view for its limits to wrap."""
    limiter = shop_limiter(app, key_func, name)
    limiter.request_filter(lambda: request.endpoint != endpoint)
    _hooks_only_for(app, limiter, endpoint)
    return limiter, app.view_functions[endpoint]


def _hooks_only_for(app, limiter: Limiter, endpoint: str) -> None:
    """Flask-Limiter hooks every request of the app (before, after, teardown) for limits of the
    whole app, which the shop's limiters have none of: for any request but `endpoint`'s, the
    filter made them do nothing, at a cost (each limiter, on every request). They now run for
    `endpoint`'s requests alone."""

    def ours(hook) -> bool:
        return getattr(hook, "__self__", None) is limiter or (isinstance(hook, partial) and limiter in hook.args)

    def gated(hook, passes_on: bool):
        def for_endpoint(*args):
            if request.endpoint == endpoint:
                return hook(*args)
            return args[0] if passes_on else None  # an after_request hook hands the response on

        return for_endpoint

    for registry, passes_on in (
        (app.before_request_funcs, False),
        (app.after_request_funcs, True),
        (app.teardown_request_funcs, False),
    ):
        hooks = registry.get(None, [])
        hooks[:] = [gated(hook, passes_on) if ours(hook) else hook for hook in hooks]


def refused(limit: RequestLimit, answer: Callable[[float], Response]) -> Response:
    """A 429 with Retry-After for a request past `limit`: `answer(wait)` says it, the wait being
    the seconds until the limit's window ends (one at least)."""
    wait = max(1.0, limit.reset_at - time.time())
    response = answer(wait)
    response.status_code = 429
    response.headers["Retry-After"] = str(math.ceil(wait))
    return response


def json_or_page(message: str, wait: float, page: Callable[[], str]) -> Response:
    """A refusal's body: JSON with the error and the wait in seconds to a client that asks for
    JSON, else `page()`."""
    if wants_json():
        return jsonify({"error": message, "status": 429, "retry_after_seconds": math.ceil(wait)})
    return current_app.make_response(page())
