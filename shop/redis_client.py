"""A Redis client from REDIS_URL (docs/REFERENCE.md, Settings): a plain `redis://`, `rediss://` or
`unix://` URL, or `redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`, for which the client
asks the Sentinels which server is the master of SERVICE and asks again after a failover, so every
process follows a promotion without a restart."""

from __future__ import annotations

from .settings import SentinelURL, parse_sentinel_url


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
