"""The demo web's access log (`flask shop up` runs gunicorn with `--logger-class` naming this):
gunicorn's own lines, with the query string kept after its `?`, what opens an order never
written, and no control character of the client's in a line. An order's private link carries
`token=`, and the payment return page's link the provider's `session_id=` (which shows the order
too); a log file that holds either hands the order to whoever reads the log. A path's `%0a` is a
newline once decoded: written as it is, it would start a line of the client's making."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

from gunicorn.glogging import Logger

from ..logs import escaped
from .supervise import UP_PROBE

# Query fields whose value opens something private: the order page's access token, the return
# page's provider session id.
SECRET_FIELDS = frozenset({"token", "session_id"})
HIDDEN = "[hidden]"
# A provider session id wherever it is (a console search's `q=`, a path): its start is enough to
# find it in the console, whose search takes a prefix of at least 12 characters.
_SESSION_ID = re.compile(r"\b(cs_(?:test|live)_)[A-Za-z0-9]+")


def short_session_ids(text: str) -> str:
    return _SESSION_ID.sub(lambda m: m.group(1) + m.group()[len(m.group(1)) :][:6] + "...", text)


def logged_query(query: str) -> str:
    """What the access log writes for a query string: "" when there is none, else "?" and the
    query with every secret field's value hidden and any provider session id cut to its start (a
    query that does not parse is hidden whole if a secret field's name is in it)."""
    if not query:
        return ""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return "?" + (HIDDEN if any(name in query for name in SECRET_FIELDS) else short_session_ids(query))
    kept = [(k, HIDDEN if k in SECRET_FIELDS else short_session_ids(v)) for k, v in pairs]
    return "?" + urlencode(kept, safe="[]")


class AccessLog(Logger):
    """gunicorn's logger, its `%(q)s` atom replaced by `logged_query`: the format writes
    `%(U)s%(q)s` and reads `/orders/BK-1?token=[hidden]`; every atom's control characters
    escaped; `up`'s own probes not written."""

    def access(self, resp, req, environ, request_time):
        if environ.get("HTTP_USER_AGENT") == UP_PROBE:
            return
        super().access(resp, req, environ, request_time)

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        atoms["q"] = logged_query(atoms.get("q") or "")
        # The request line holds the raw query: its secrets go the same way.
        raw = atoms.get("r")
        if isinstance(raw, str) and "?" in raw:
            method_path, _, rest = raw.partition("?")
            query, space, protocol = rest.rpartition(" ")
            atoms["r"] = method_path + logged_query(query) + space + protocol
        for name, value in atoms.items():
            if isinstance(value, str):
                atoms[name] = escaped(short_session_ids(value))
        return atoms
