"""The guard's limits, read from the settings once per app (docs/REFERENCE.md, Settings)."""

from __future__ import annotations

from dataclasses import dataclass

# A token granted longer ago than this when its request is about to be written (the caller's
# thread was held up: the GIL, the scheduler, the pooled connection) is given back unused and
# another is taken: a late call would arrive at the provider together with calls granted after
# it. The account bucket's margin (Limits.bucket_capacity) and the endpoint window's slack
# (ENDPOINT_WINDOW_SLACK_SECONDS) cover this much lateness plus the way from here to the provider.
GRANT_FRESH_SECONDS = 0.1
# Each endpoint's window is this much longer than the provider's second: a call arrives at most
# GRANT_FRESH_SECONDS plus its way to the provider after its grant, so calls granted within any
# 1 + slack seconds cover every second the provider counts, and STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND
# grants in such a window never make more than that many arrivals in one second.
ENDPOINT_WINDOW_SLACK_SECONDS = 0.15


@dataclass(frozen=True)
class Limits:
    max_concurrent: int
    rate_per_second: int
    breaker_threshold: int
    breaker_cooldown_seconds: float
    customer_wait_seconds: float
    background_wait_seconds: float
    probe_seconds: float
    processes: int = 1  # web processes sharing the budget (WEB_CONCURRENCY)
    threads: int = 0  # this process's threads (WEB_THREADS); 0: no limit on waiters
    endpoint_rate_per_second: int = 0  # STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND; 0: no per-endpoint limit

    @property
    def max_waiting(self) -> int:
        """How many threads may wait for a bulkhead slot at once; beyond them a call is refused
        without waiting. Waiting threads are threads too: in a brownout, when no slot frees for
        seconds, every checkout past the bulkhead would otherwise hold a thread for its whole
        wait, and the catalog would queue behind them. An eighth of the threads, never the last
        free one."""
        if self.threads <= 0:
            return 1 << 30
        return max(0, min(max(1, self.threads // 8), self.threads - self.max_concurrent - 1))

    @property
    def bucket_capacity(self) -> float:
        # A bucket lets `capacity + refill * L` calls through in any L seconds of its clock
        # (Redis's). Burst 10% and refill 70% of the rate: 80% in any one second by the time
        # calls are granted, and the rest absorbs up to 0.28 s between a grant and the call's
        # arrival at the provider (threads and processes are scheduled late under load, which
        # bunches arrivals; a grant older than GRANT_FRESH_SECONDS is not used), so the provider
        # never counts more than STRIPE_RATE_LIMIT_PER_SECOND in any sliding second.
        return max(1, self.rate_per_second // 10)

    @property
    def refill_per_second(self) -> float:
        return max(1.0, self.rate_per_second * 0.7)

    @property
    def background_reserve(self) -> float:
        # Background calls leave half the burst to customers (with a burst of 1, below 20/s,
        # a reserve would keep them out for good: they compete then).
        return min(self.bucket_capacity / 2, self.bucket_capacity - 1)

    @property
    def endpoint_window_seconds(self) -> float:
        return 1.0 + ENDPOINT_WINDOW_SLACK_SECONDS

    @property
    def endpoint_reserve(self) -> int:
        """Places in each endpoint's window that background callers leave to customers: a
        tenth (none below 10/s, where a reserve would shut them out)."""
        return self.endpoint_rate_per_second // 10


def limits_from(cfg) -> Limits:
    return Limits(
        max_concurrent=cfg["STRIPE_MAX_CONCURRENT_CALLS"],
        rate_per_second=cfg["STRIPE_RATE_LIMIT_PER_SECOND"],
        breaker_threshold=cfg["STRIPE_BREAKER_THRESHOLD"],
        breaker_cooldown_seconds=cfg["STRIPE_BREAKER_COOLDOWN_SECONDS"],
        customer_wait_seconds=cfg["STRIPE_CUSTOMER_WAIT_SECONDS"],
        background_wait_seconds=cfg["STRIPE_BACKGROUND_WAIT_SECONDS"],
        probe_seconds=cfg["STRIPE_BREAKER_PROBE_SECONDS"],
        processes=max(1, cfg["WEB_CONCURRENCY"]),
        threads=cfg["WEB_THREADS"],
        endpoint_rate_per_second=cfg["STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND"],
    )
