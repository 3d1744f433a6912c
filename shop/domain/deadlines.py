"""Deadline and retry arithmetic. Every function takes `now`, so it is testable without clocks."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """Databases hand back naive datetimes (SQLite) or aware ones (PostgreSQL): treat naive as UTC."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def unpaid_deadline(last_change: datetime, window_seconds: int) -> datetime:
    """When an unpaid order (PendingPayment / PaymentFailed) stops holding its stock."""
    return as_utc(last_change) + timedelta(seconds=window_seconds)


def is_unpaid_order_due(now: datetime, last_change: datetime, window_seconds: int) -> bool:
    return as_utc(now) >= unpaid_deadline(last_change, window_seconds)


# The provider checks its minimum against its own clock when the request arrives: a little
# slack keeps a request that takes a second or two from being refused at the boundary.
SESSION_SLACK_SECONDS = 15


def session_expires_at(pay_by: datetime, now: datetime, min_seconds: int) -> datetime:
    """A checkout session lives until the order's pay-by time, but the provider refuses a
    lifetime shorter than its minimum, so it is never earlier than now + min_seconds."""
    earliest = as_utc(now) + timedelta(seconds=min_seconds + SESSION_SLACK_SECONDS)
    return max(as_utc(pay_by), earliest)


def retry_delay_seconds(attempts: int, base: float = 2.0, cap: float = 300.0, rng=random.random) -> float:
    """Exponential backoff with jitter: base * 2^(attempts-1), capped, scaled by [0.5, 1.0)."""
    exponent = max(0, attempts - 1)
    delay = min(cap, base * (2 ** min(exponent, 30)))
    return delay * (0.5 + rng() / 2)
