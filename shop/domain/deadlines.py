"""Deadline and retry arithmetic. Every function takes `now`, so it is testable without clocks."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import StrEnum

from .. import clock
from .order import OrderStatus


def utcnow() -> datetime:
    """Now, on the process's clock (shop.clock: the system's, or the one a test moves)."""
    return clock.current().now()


def as_utc(value: datetime) -> datetime:
    """Databases hand back naive datetimes (SQLite) or aware ones (PostgreSQL): treat naive as UTC."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def unpaid_deadline(last_change: datetime, window_seconds: int) -> datetime:
    """When an unpaid order (PendingPayment / PaymentFailed) stops holding its stock."""
    return as_utc(last_change) + timedelta(seconds=window_seconds)


def unpaid_hold_seconds(status: OrderStatus, window_seconds: int, hold_without_session_seconds: int) -> int:
    """How long an unpaid order holds its stock after its last change. One that never had a
    payment session (PendingPayment: the provider could not be reached, or the order still waits
    in line for its page) only the short hold, so that a flood of them during an outage cannot
    hold the catalog for the whole window; one whose payment failed (PaymentFailed) a fresh full
    window. Never longer than the window, whatever the configuration says."""
    if status is OrderStatus.PENDING_PAYMENT:
        return min(hold_without_session_seconds, window_seconds)
    return window_seconds


def session_pay_by(status: OrderStatus, last_change: datetime, now: datetime, window_seconds: int) -> datetime:
    """The pay-by time a new Checkout Session is made for (its expires_at follows it, see
    `session_expires_at`, and the order's pay-by becomes that expires_at). An order that never
    had a session gets the full window from now, when its payment page comes to exist, however
    much of its short hold is left; after a failed payment, the window the failure opened."""
    if status is OrderStatus.PENDING_PAYMENT:
        return as_utc(now) + timedelta(seconds=window_seconds)
    return unpaid_deadline(last_change, window_seconds)


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


# -- what a failed attempt at durable work leads to -------------------------------------------


class FailureKind(StrEnum):
    """Why an attempt failed, as the runner classifies the exception (and the column keeps it)."""

    ERROR = "error"  # anything else: counts against the attempt budget
    REFUSED = "refused"  # retrying cannot help (the provider said no for good): dead now
    PROVIDER = "provider"  # the provider is down, slow or rate-limiting: wait for it


FAILURE_ERROR, FAILURE_REFUSED, FAILURE_PROVIDER = FailureKind.ERROR, FailureKind.REFUSED, FailureKind.PROVIDER


@dataclass(frozen=True)
class RetryDecision:
    dead: bool
    delay_seconds: float = 0.0
    spends_attempt: bool = True


def retry_decision(
    kind: FailureKind,
    attempts: int,
    max_attempts: int,
    provider_waits: int,
    *,
    base: float,
    cap: float,
    provider_base: float,
    provider_cap: float,
    rng=random.random,
) -> RetryDecision:
    """What the runner does after a failed attempt.

    `attempts` counts this attempt; `provider_waits` counts the provider failures in a row
    before this one. A provider that does not answer is not a reason to give up: Stripe's
    outages and rate limits last minutes to hours (its own webhook retries run for days), and
    giving up on a refund keeps a customer's money. Such a failure gives its attempt back and
    waits, backing off up to `provider_cap`, for as long as it takes; only a refusal or errors
    of our own use up the budget and dead-letter the row."""
    if kind == FAILURE_REFUSED:
        return RetryDecision(dead=True)
    if kind == FAILURE_PROVIDER:
        return RetryDecision(
            dead=False,
            spends_attempt=False,
            delay_seconds=retry_delay_seconds(provider_waits + 1, provider_base, provider_cap, rng),
        )
    if attempts >= max_attempts:
        return RetryDecision(dead=True)
    return RetryDecision(dead=False, delay_seconds=retry_delay_seconds(attempts, base, cap, rng))


# -- when the sweep asks the provider again ---------------------------------------------------


def next_provider_check(now: datetime, since: datetime, interval_seconds: float, cap_seconds: float) -> datetime:
    """When the sweep should ask the provider again about an answer that may change at any
    moment but usually does not (an async payment settling, a cancelled order's session that
    could still take money). The wait grows with the time already waited since `since`, so the
    checks double in spacing (one sweep interval, two, four...) up to `cap_seconds`: a settlement
    whose webhook is lost is found within the cap plus a cycle, however long it took the bank,
    and a payment that takes days costs a few provider calls an hour, not one per cycle.

    The due time is half an interval early: the sweep runs once per interval and asks late in
    its own cycle, so a check due exactly one interval later would just miss the next cycle."""
    interval = float(interval_seconds)
    waited = max(0.0, (as_utc(now) - as_utc(since)).total_seconds())
    delay = min(max(cap_seconds, interval), max(interval, waited))
    return as_utc(now) + timedelta(seconds=delay - interval / 2)
