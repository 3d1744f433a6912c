"""This process's own view of the breaker and the budget, used while Redis cannot be reached."""

from __future__ import annotations

import threading
from collections import deque

from .breaker import PROBE_SPACING_SECONDS, BreakerState, ProbeTurn, probe_interval
from .budget import Held
from .limits import Limits


class _LocalState:
    """This process's own breaker and budget: used while Redis cannot be reached. The same rules
    as the scripts (breaker.py, budget.py), on this process's clock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.state, self.failures, self.opened_at = BreakerState.CLOSED, 0, 0.0
        self.probe_until = self.next_probe_at = self.last_probe_at = 0.0
        self.probe_failures = 0
        self.transitions = {BreakerState.CLOSED: 0, BreakerState.OPEN: 0, BreakerState.HALF_OPEN: 0}
        self.tokens, self.at, self.paused_until = None, 0.0, 0.0
        self.windows: dict[str, deque] = {}

    def admit(self) -> tuple[int, BreakerState]:
        with self.lock:
            return (1 if self.state is BreakerState.CLOSED else 0), self.state

    def record(self, now, ok: bool, limits: Limits) -> BreakerState:
        with self.lock:
            if ok:
                self.failures = 0
                if self.state is not BreakerState.CLOSED:
                    self._close()
                return self.state
            if self.state is not BreakerState.CLOSED:
                return self.state
            self.failures += 1
            if self.failures >= limits.breaker_threshold:
                self.state, self.opened_at, self.failures, self.probe_failures = BreakerState.OPEN, now, 0, 0
                self.probe_until, self.next_probe_at = 0.0, now + PROBE_SPACING_SECONDS
                self.transitions[BreakerState.OPEN] += 1
            return self.state

    def _close(self) -> None:
        self.state, self.failures, self.probe_failures, self.probe_until = BreakerState.CLOSED, 0, 0, 0.0
        self.transitions[BreakerState.CLOSED] += 1

    def claim_probe(self, now, limits: Limits) -> ProbeTurn:
        with self.lock:
            if self.state is BreakerState.CLOSED:
                return ProbeTurn(closed=True)
            due = max(self.next_probe_at, self.probe_until)
            if now < due:
                return ProbeTurn(closed=False, wait=due - now)
            if self.state is BreakerState.OPEN:
                self.transitions[BreakerState.HALF_OPEN] += 1
            self.state, self.probe_until = BreakerState.HALF_OPEN, now + limits.probe_seconds
            self.next_probe_at, self.last_probe_at = now + PROBE_SPACING_SECONDS, now
            return ProbeTurn(closed=False, mine=True)

    def probe_result(self, now, ok: bool, limits: Limits) -> BreakerState:
        with self.lock:
            if self.state is BreakerState.CLOSED:
                return BreakerState.CLOSED
            if ok:
                self._close()
                return BreakerState.CLOSED
            self.probe_failures += 1
            wait = probe_interval(self.probe_failures, limits.breaker_cooldown_seconds)
            if self.state is BreakerState.HALF_OPEN:
                self.transitions[BreakerState.OPEN] += 1
            self.state, self.probe_until = BreakerState.OPEN, 0.0
            self.next_probe_at = max(self.last_probe_at + wait, now)
            return BreakerState.OPEN

    def take(self, now, limits: Limits, floor: float, endpoint: str, customer: bool) -> tuple[float, Held]:
        """(seconds to wait, which budget held it), (0.0, Held.NONE) when granted."""
        with self.lock:
            # Without Redis this process cannot see what the others spend: it keeps to its share.
            share = limits.processes
            cap, rate = max(1.0, limits.bucket_capacity / share), limits.refill_per_second / share
            floor = min(floor / share, cap - 1)
            # Never back in time: a thread that read the clock before waiting for this lock
            # would rewind `at`, and the next caller would be refilled twice (see _BUCKET_TAKE).
            now = max(now, self.at)
            tokens = cap if self.tokens is None else min(cap, self.tokens + (now - self.at) * rate)
            self.tokens, self.at = tokens, now
            if self.paused_until > now:
                return self.paused_until - now, Held.PAUSED
            wait, held = ((floor + 1 - tokens) / rate, Held.ACCOUNT) if tokens - 1 < floor else (0.0, Held.NONE)
            window = None
            if limits.endpoint_rate_per_second:
                span = limits.endpoint_window_seconds
                window = self.windows.setdefault(endpoint, deque())
                while window and window[0] <= now - span:
                    window.popleft()
                room = max(1, (limits.endpoint_rate_per_second - (0 if customer else limits.endpoint_reserve)) // share)
                if len(window) >= room:
                    ep_wait = window[len(window) - room] + span - now
                    if ep_wait >= wait:
                        wait, held = ep_wait, Held.ENDPOINT
            if held:
                return max(wait, 0.001), held
            self.tokens = tokens - 1
            if window is not None:
                window.append(now)
            return 0.0, Held.NONE

    def pause(self, until: float) -> None:
        with self.lock:
            self.paused_until = max(self.paused_until, until)

    def view(self) -> dict:
        with self.lock:
            return {
                "state": self.state,
                "failures": self.failures,
                "opened_at": self.opened_at,
                "last_probe_at": self.last_probe_at or None,
                "probe_failures": self.probe_failures,
                "transitions": dict(self.transitions),
            }
