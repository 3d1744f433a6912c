"""A Redis client from REDIS_URL (docs/REFERENCE.md, Settings): a plain `redis://`, `rediss://` or
`unix://` URL, or `redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`, for which the client
asks the Sentinels which server is the master of SERVICE and asks again after a failover, so every
process follows a promotion without a restart."""

from __future__ import annotations

import ipaddress
import logging
from urllib.parse import parse_qs, urlsplit

from .settings_values import SentinelURL, parse_sentinel_url

log = logging.getLogger("shop")


def redis_client(url: str, *, socket_connect_timeout: float, socket_timeout: float, **options):
    from redis import Redis

    if not url.startswith("redis+sentinel://"):
        return Redis.from_url(
            url, socket_connect_timeout=socket_connect_timeout, socket_timeout=socket_timeout, **options
        )
    return _master(parse_sentinel_url(url), socket_connect_timeout, socket_timeout, options)


def _master(where: SentinelURL, connect_timeout: float, timeout: float, options: dict):
    from redis.sentinel import Sentinel

    sentinels = Sentinel(
        where.sentinels,
        sentinel_kwargs={"socket_connect_timeout": connect_timeout, "socket_timeout": timeout},
        socket_connect_timeout=connect_timeout,
        socket_timeout=timeout,
    )
    return sentinels.master_for(
        where.service,
        db=where.db,
        username=where.username,
        password=where.password,
        socket_connect_timeout=connect_timeout,
        socket_timeout=timeout,
        **options,
    )


def _loopback(host: str | None) -> bool:
    host = (host or "localhost").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (not looked up: it may point anywhere)


def unprotected_redis_hosts(url: str) -> list[str]:
    """The hosts REDIS_URL reaches beyond this machine with no password: a `redis://` URL, or the
    Sentinels of a `redis+sentinel://` one, without a password in the URL. Empty when it carries
    one, when every host is loopback, and for `rediss://` (TLS, perhaps with client certificates)
    and `unix://` (a socket's file permissions guard it)."""
    if url.startswith("redis+sentinel://"):
        where = parse_sentinel_url(url)
        hosts, password = [f"{host}:{port}" for host, port in where.sentinels], where.password
        remote = [h for h, (host, _) in zip(hosts, where.sentinels, strict=True) if not _loopback(host)]
    elif url.startswith("redis://"):
        parts = urlsplit(url)
        password = parts.password or parse_qs(parts.query).get("password", [""])[0]
        remote = [] if _loopback(parts.hostname) else [parts.netloc.rpartition("@")[2]]
    else:
        return []
    return [] if password else remote


def unprotected_redis_words(hosts: list[str]) -> str:
    """What to say about `hosts` (unprotected_redis_hosts): the start-up warning's words, and the
    `redis-auth` line of `flask shop check`."""
    return (
        f"REDIS_URL reaches Redis at {', '.join(hosts)}, not on this machine, with no password: anyone who "
        "reaches it can queue jobs and read the shop's queues. Give Redis a password (requirepass, then "
        "redis://:PASSWORD@HOST or redis+sentinel://:PASSWORD@HOST:PORT/SERVICE) or keep it on a network "
        "only the shop reaches (docs/REFERENCE.md, Settings)."
    )


def warn_when_redis_is_unprotected(url: str) -> bool:
    """At start-up (web, worker, scheduler): one WARNING line when REDIS_URL reaches a Redis on
    another machine without a password. Whoever can write to that Redis can queue jobs and read
    the shop's queues; the worker runs only shop.jobs' entry points on JSON ids, but a password
    (or a network only the shop reaches) is still the door. Never stops the process."""
    hosts = unprotected_redis_hosts(url)
    if hosts:
        log.warning("%s", unprotected_redis_words(hosts))
    return bool(hosts)
