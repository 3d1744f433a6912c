"""The demo web's access log (`flask shop up` runs gunicorn with `--logger-class` naming this):
gunicorn's own lines, with the query string kept after its `?` and the order's private access
token never written. An order's private link carries `token=`; a log file that holds it hands
the order to whoever reads the log."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from gunicorn.glogging import Logger

from .supervise import UP_PROBE

# Query fields whose value opens something private: the order page's access token.
SECRET_FIELDS = frozenset({"token"})
HIDDEN = "[hidden]"


def logged_query(query: str) -> str:
    """What the access log writes for a query string: "" when there is none, else "?" and the
    query with every secret field's value hidden (a query that does not parse is hidden whole
    if a secret field's name is in it)."""
    if not query:
        return ""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return "?" + (HIDDEN if any(name in query for name in SECRET_FIELDS) else query)
    return "?" + urlencode([(k, HIDDEN if k in SECRET_FIELDS else v) for k, v in pairs], safe="[]")


class AccessLog(Logger):
    """gunicorn's logger, its `%(q)s` atom replaced by `logged_query`: the format writes
    `%(U)s%(q)s` and reads `/orders/BK-1?token=[hidden]`; `up`'s own probes are not written."""

    def access(self, resp, req, environ, request_time):
        if environ.get("HTTP_USER_AGENT") == UP_PROBE:
            return
        super().access(resp, req, environ, request_time)

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        atoms["q"] = logged_query(atoms.get("q") or "")
        return atoms
