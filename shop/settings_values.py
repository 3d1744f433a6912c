"""One environment variable at a time, read and checked (docs/REFERENCE.md, Settings): the readers
every setting uses (a whole number in bounds, true or false, a URL of known schemes, country codes),
and the values with rules of their own (the database's and Redis's URLs, a Sentinel URL, the node
name, the metrics token, SMTP and the mail's addresses, the Sentry DSN, the pooler, the web front, the log format, the
payment methods and tax). A bad value is a SettingsError naming the variable; shop.settings
assembles them and checks the settings that depend on one another."""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Mapping
from email.utils import getaddresses, parseaddr
from typing import NamedTuple, overload
from urllib.parse import urlsplit

from .domain import payment_methods
from .domain.payment import CaptureMode, TaxMode
from .domain.payment_methods import DEFAULT_PAYMENT_METHODS
from .logs import FORMATS as LOG_FORMATS
from .logs import TEXT as LOG_FORMAT_TEXT
from .node import MAX_LENGTH as NODE_NAME_MAX_LENGTH
from .node import host_node_name


class SettingsError(Exception):
    """A configuration value is missing or wrong. The message names the variable."""

    def __init__(self, variable: str, problem: str):
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_countries(env, name, default):
    """A comma-separated list of two-letter ISO country codes (`US,CA,GB`), as Stripe takes them."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    codes = tuple(dict.fromkeys(part.strip().upper() for part in raw.split(",") if part.strip()))
    wrong = [code for code in codes if len(code) != 2 or not code.isascii() or not code.isalpha()]
    if not codes or wrong:
        got = ", ".join(wrong) if wrong else repr(raw)
        raise SettingsError(name, f"must be two-letter country codes separated by commas (US,CA,GB), got {got}")
    return codes


def env_int(env, name, default, lo, hi):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(name, f"must be a whole number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise SettingsError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def env_bool(env, name, default):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(name, f"must be true or false, got {raw!r}")


class SentinelURL(NamedTuple):
    sentinels: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    password: str | None


def parse_sentinel_url(url: str) -> SentinelURL:
    """`redis+sentinel://[[user]:password@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]` (the form
    Flask-Limiter's storage reads too), or ValueError saying what is wrong with it."""
    rest = url.removeprefix("redis+sentinel://")
    auth, _, rest = rest.rpartition("@")
    where, _, path = rest.partition("/")
    parts = [p for p in path.split("/") if p]
    if not where or not parts or len(parts) > 2:
        raise ValueError("expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
    sentinels = []
    for endpoint in where.split(","):
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a Sentinel is HOST:PORT, got {endpoint!r}")
        sentinels.append((host, int(port)))
    if len(parts) == 2 and not parts[1].isdigit():
        raise ValueError(f"the database after the service is a number, got {parts[1]!r}")
    user, _, password = auth.partition(":") if auth else ("", "", "")
    return SentinelURL(sentinels, parts[0], int(parts[1]) if len(parts) == 2 else 0, user or None, password or None)


def env_redis_url(env) -> str:
    url = env_url(
        env, "REDIS_URL", "redis://127.0.0.1:6379/0", ["redis://", "rediss://", "unix://", "redis+sentinel://"]
    )
    if url.startswith("redis+sentinel://"):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise SettingsError("REDIS_URL", f"{exc}, got {url!r}") from None
    return url


@overload
def env_url(env: Mapping[str, str], name: str, default: str, schemes: list[str]) -> str: ...
@overload
def env_url(env: Mapping[str, str], name: str, default: None, schemes: list[str]) -> str | None: ...
def env_url(env: Mapping[str, str], name: str, default: str | None, schemes: list[str]) -> str | None:
    """`name`'s URL, checked against `schemes`; `default` when unset (None only when the default is None)."""
    value = (env.get(name) or "").strip() or default
    if value is None:
        return None
    if not any(value.startswith(s) for s in schemes):
        raise SettingsError(name, f"must start with one of {', '.join(schemes)}, got {value!r}")
    return value.rstrip("/") if schemes[0].startswith("http") else value


def env_database_url(env, instance_path: str) -> str:
    default_db = "sqlite:///" + os.path.join(os.path.abspath(instance_path), "backstop.sqlite3")
    database_url = env_url(env, "DATABASE_URL", default_db, ["sqlite", "postgresql"])
    if database_url.startswith("postgresql://") or database_url.startswith("postgres://"):
        # psycopg 3 is the driver we ship and test; plain postgresql:// would pick psycopg2.
        database_url = "postgresql+psycopg://" + database_url.split("://", 1)[1]
    return database_url


def env_node_name(env) -> str:
    """BACKSTOP_NODE_NAME: the first part of every identity this process leaves in PostgreSQL and
    Redis (`node:pid:...`), a log field and a metrics label, hence no ':' and no spaces."""
    raw = (env.get("BACKSTOP_NODE_NAME") or "").strip()
    if not raw:
        return host_node_name()
    if len(raw) > NODE_NAME_MAX_LENGTH:
        raise SettingsError("BACKSTOP_NODE_NAME", f"must be at most {NODE_NAME_MAX_LENGTH} characters, got {len(raw)}")
    if ":" in raw:
        raise SettingsError("BACKSTOP_NODE_NAME", f"must not contain ':' (identities are node:pid:...), got {raw!r}")
    if not raw.isprintable() or any(c.isspace() for c in raw):
        raise SettingsError("BACKSTOP_NODE_NAME", f"must be printable, without spaces, got {raw!r}")
    return raw


METRICS_TOKEN_MIN_LENGTH = 16


def env_metrics_token(env) -> str | None:
    """METRICS_TOKEN: unset (or blank) leaves /metrics open. Set, it must be long enough not to be
    guessed and fit in an Authorization header as sent. The message never repeats the value: it
    is a secret, and the line goes to the log."""
    raw = (env.get("METRICS_TOKEN") or "").strip()
    if not raw:
        return None
    if len(raw) < METRICS_TOKEN_MIN_LENGTH:
        raise SettingsError("METRICS_TOKEN", f"must be at least {METRICS_TOKEN_MIN_LENGTH} characters, got {len(raw)}")
    if not all("!" <= c <= "~" for c in raw):
        raise SettingsError(
            "METRICS_TOKEN", "must be printable ASCII without spaces (a scraper sends it in an Authorization header)"
        )
    return raw


SMTP_SCHEMES = ["smtp://", "smtp+starttls://", "smtps://"]


def env_smtp_url(env) -> str | None:
    """SMTP_URL: unset writes mail to files. The message names the scheme only: the URL may
    carry the mail server's password, and the line goes to the log."""
    raw = (env.get("SMTP_URL") or "").strip()
    if not raw:
        return None
    if not any(raw.startswith(s) for s in SMTP_SCHEMES):
        scheme = raw.split("://", 1)[0] + "://" if "://" in raw else "no scheme"
        raise SettingsError("SMTP_URL", f"must start with one of {', '.join(SMTP_SCHEMES)}, got {scheme}")
    return raw


def env_smtp_ca_file(env) -> str | None:
    """SMTP_CA_FILE: a PEM bundle the mailer trusts for the mail server's certificate. Checked
    here, so a wrong path stops the start instead of every email failing later, one by one."""
    raw = (env.get("SMTP_CA_FILE") or "").strip()
    if not raw:
        return None
    if not os.path.isfile(raw):
        raise SettingsError("SMTP_CA_FILE", f"no such file: {raw!r}")
    if not os.access(raw, os.R_OK):
        raise SettingsError("SMTP_CA_FILE", f"cannot be read by this process: {raw!r}")
    try:
        ssl.create_default_context(cafile=raw)
    except (ssl.SSLError, ValueError, OSError) as exc:
        raise SettingsError("SMTP_CA_FILE", f"is not a PEM certificate bundle ({exc}): {raw!r}") from None
    return os.path.abspath(raw)


POOLERS = ("none", "pgbouncer")
WEB_FRONTS = ("nginx", "none")


def env_web_front(env) -> str:
    raw = (env.get("WEB_FRONT") or "").strip().lower() or "nginx"
    if raw not in WEB_FRONTS:
        raise SettingsError("WEB_FRONT", f"must be one of {', '.join(WEB_FRONTS)}, got {raw!r}")
    return raw


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_PROXY_HOPS = 5


class TrustedProxies(NamedTuple):
    """TRUSTED_PROXIES: who may say, in X-Forwarded-For, which client a request is for. `hops`: that
    many proxies always stand in front (a platform's router: 1), whoever connected; `networks`:
    the proxies are the peers in these networks. Neither (the default): nobody is believed, and a
    request's client is whatever connected (the shop's own front aside: shop.web.proxies)."""

    hops: int = 0
    networks: tuple[Network, ...] = ()

    def in_words(self) -> str:
        if self.hops:
            return f"the last {self.hops} X-Forwarded-For hop(s) are trusted proxies"
        if self.networks:
            return "peers in " + ", ".join(str(n) for n in self.networks) + " are trusted proxies"
        return "no proxy trusted"


TRUSTED_PROXIES_FORM = "a hop count (1) or networks separated by commas (10.0.0.0/8,192.0.2.7)"


def parse_trusted_proxies(raw: str | None) -> TrustedProxies:
    """`2`, or `10.0.0.0/8, 2001:db8::/32, 192.0.2.7` (an address alone is its own network)."""
    if raw is None or raw.strip() in ("", "0"):
        return TrustedProxies()
    parts = [part.strip() for part in raw.split(",")]
    if len(parts) == 1 and parts[0].isdigit():
        hops = int(parts[0])
        if hops > MAX_PROXY_HOPS:
            raise SettingsError("TRUSTED_PROXIES", f"a hop count must be between 0 and {MAX_PROXY_HOPS}, got {hops}")
        return TrustedProxies(hops=hops)
    networks = []
    for part in parts:
        if part.isdigit():
            raise SettingsError("TRUSTED_PROXIES", f"give a hop count or networks, not both, got {raw.strip()!r}")
        try:
            networks.append(ipaddress.ip_network(part))
        except ValueError:
            networks.append(_network_problem(part))
    return TrustedProxies(networks=tuple(networks))


def _network_problem(part: str) -> Network:
    """Raises the SettingsError for a part that is not a network, in words."""
    try:
        meant = ipaddress.ip_network(part, strict=False)
    except ValueError:
        meant = None
    if meant is None:
        raise SettingsError("TRUSTED_PROXIES", f"must be {TRUSTED_PROXIES_FORM}, got {part!r}")
    raise SettingsError("TRUSTED_PROXIES", f"{part} has bits set past its prefix: did you mean {meant}?")


def env_trusted_proxies(env) -> TrustedProxies:
    return parse_trusted_proxies(env.get("TRUSTED_PROXIES"))


def env_log_format(env) -> str:
    raw = (env.get("LOG_FORMAT") or "").strip().lower() or LOG_FORMAT_TEXT
    if raw not in LOG_FORMATS:
        raise SettingsError("LOG_FORMAT", f"must be one of {', '.join(LOG_FORMATS)}, got {raw!r}")
    return raw


def env_sentry_dsn(env) -> str | None:
    """SENTRY_DSN: unset reports nothing. A DSN is `http(s)://KEY@HOST[:PORT]/PROJECT`; the
    message names what is wrong without repeating the value (its key goes to the log otherwise)."""
    raw = (env.get("SENTRY_DSN") or "").strip()
    if not raw:
        return None
    try:
        parts = urlsplit(raw)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise SettingsError("SENTRY_DSN", f"is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        scheme = f"{parts.scheme}://" if parts.scheme else "no scheme"
        raise SettingsError("SENTRY_DSN", f"must start with one of http://, https://, got {scheme}")
    if not parts.username or not parts.hostname:
        raise SettingsError("SENTRY_DSN", "must name a key and a host: http(s)://KEY@HOST/PROJECT")
    if not parts.path.strip("/"):
        raise SettingsError("SENTRY_DSN", "must end with the project: http(s)://KEY@HOST/PROJECT")
    return raw


def env_pooler(env, database_url: str) -> str:
    raw = (env.get("DATABASE_POOLER") or "").strip().lower() or "none"
    if raw not in POOLERS:
        raise SettingsError("DATABASE_POOLER", f"must be one of {', '.join(POOLERS)}, got {raw!r}")
    if raw != "none" and not database_url.startswith("postgresql"):
        raise SettingsError("DATABASE_POOLER", f"{raw} stands in front of PostgreSQL; DATABASE_URL is not PostgreSQL")
    return raw


def env_payment_methods(env) -> tuple[str, ...]:
    """PAYMENT_METHODS: payment method types separated by commas (`card,link`), each one whose
    money is confirmed while the customer is on the payment page (shop.domain.payment_methods)."""
    raw = env.get("PAYMENT_METHODS")
    if raw is None or raw.strip() == "":
        return DEFAULT_PAYMENT_METHODS
    methods = tuple(dict.fromkeys(part.strip().lower() for part in raw.split(",") if part.strip()))
    if not methods:
        raise SettingsError("PAYMENT_METHODS", f"must name at least one payment method type, got {raw!r}")
    refused = [why for why in map(payment_methods.refusal, methods) if why]
    if refused:
        raise SettingsError("PAYMENT_METHODS", "; ".join(refused))
    return methods


def env_capture_mode(env) -> CaptureMode:
    raw = (env.get("CAPTURE_MODE") or "").strip().lower() or CaptureMode.CHECKOUT
    if raw not in set(CaptureMode):
        raise SettingsError("CAPTURE_MODE", f"must be one of {', '.join(CaptureMode)}, got {raw!r}")
    return CaptureMode(raw)


def env_tax_mode(env) -> TaxMode:
    raw = (env.get("TAX_MODE") or "").strip().lower() or TaxMode.NONE
    if raw not in set(TaxMode):
        raise SettingsError("TAX_MODE", f"must be one of {', '.join(TaxMode)}, got {raw!r}")
    return TaxMode(raw)


# MAIL_FROM unless set: fine for the demo's files, but a real mail server's recipients would see
# (and their spam filters judge) a sender at localhost; `flask shop check` warns when SMTP_URL is set.
DEFAULT_MAIL_FROM = "Backstop shop <shop@localhost>"


def mail_address_problem(raw: str) -> str | None:
    """Why `raw` is not one address as a From or Reply-To header carries it (`Name <a@b>` or
    `a@b`), or None. Checked at start: a bad sender makes every email fail later, one by one."""
    if any(c in raw for c in "\r\n\x00"):
        return "must be one line"
    found = getaddresses([raw])
    local, at, domain = found[0][1].rpartition("@") if len(found) == 1 else ("", "", "")
    if (
        not at
        or not local
        or "@" in local
        or any(c.isspace() for c in found[0][1])
        or not (domain == "localhost" or "." in domain.strip("."))
    ):
        return f"must be one email address, as `Name <shop@example.com>` or `shop@example.com`, got {raw!r}"
    return None


def env_mail_address(env, name: str, default: str | None) -> str | None:
    """MAIL_FROM, MAIL_REPLY_TO: one address (`Name <a@b>` or `a@b`); `default` when unset."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    problem = mail_address_problem(raw)
    if problem:
        raise SettingsError(name, problem)
    return raw


def env_shop_contact(env) -> str | None:
    """SHOP_CONTACT: how a customer reaches the shop, an email address or an http(s) URL (a contact
    page); shown in the storefront's footer and in every email."""
    raw = (env.get("SHOP_CONTACT") or "").strip()
    if not raw:
        return None
    if raw.startswith(("http://", "https://")):
        parts = urlsplit(raw)
        if parts.hostname and not any(c.isspace() for c in raw):
            return raw
        raise SettingsError("SHOP_CONTACT", f"must be an email address or an http(s):// URL with a host, got {raw!r}")
    if "@" in raw and mail_address_problem(raw) is None and parseaddr(raw)[1] == raw:
        return raw
    raise SettingsError(
        "SHOP_CONTACT", f"must be an email address (help@shop.example) or an http(s):// URL, got {raw!r}"
    )
