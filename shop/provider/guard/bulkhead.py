"""The bulkhead, per process: at most STRIPE_MAX_CONCURRENT_CALLS provider calls in flight. A
customer's call that gets no slot within a short wait is refused, and only a few threads may wait
at once (Limits.max_waiting; the rest are refused at once), so the other threads stay free."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from .calls import Priority, current
from .limits import Limits
from .refusals import Shed, ShedKind


class Bulkhead:
    def __init__(self, limits: Limits):
        self.limits = limits
        self.slots = threading.BoundedSemaphore(limits.max_concurrent)
        self._waiting_lock = threading.Lock()
        self._waiting = 0

    @contextmanager
    def slot(self, wait: float | None = None):
        """A place among this process's provider calls in flight, or Shed."""
        if wait is None:
            wait = (
                self.limits.customer_wait_seconds
                if current().priority is Priority.CUSTOMER
                else self.limits.background_wait_seconds
            )
        if not self.slots.acquire(blocking=False):
            with self._waiting_lock:
                may_wait = self._waiting < self.limits.max_waiting
                self._waiting += may_wait
            try:
                got = may_wait and wait > 0 and self.slots.acquire(timeout=wait)
            finally:
                if may_wait:
                    with self._waiting_lock:
                        self._waiting -= 1
            if not got:
                raise Shed(
                    f"{self.limits.max_concurrent} provider call(s) already in flight in this process "
                    "(STRIPE_MAX_CONCURRENT_CALLS)",
                    kind=ShedKind.BULKHEAD,
                )
        try:
            yield
        finally:
            self.slots.release()
