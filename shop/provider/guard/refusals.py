"""Why the guard refused a provider call: `Shed`, with its kind."""

from __future__ import annotations

from enum import StrEnum


class ShedKind(StrEnum):
    """Why a call was refused (Shed.kind): the provider's budget or this process's slots, which a
    queued order waits out (BUDGET, BULKHEAD, LINE), or the provider being down (BREAKER), or the
    request's own time running out (DEADLINE)."""

    BUDGET = "budget"
    BULKHEAD = "bulkhead"
    LINE = "line"
    BREAKER = "breaker"
    DEADLINE = "deadline"


class Shed(Exception):
    """The guard refused a provider call before it was made (or stopped waiting for it)."""

    def __init__(self, message: str, retry_after: float | None = None, kind: ShedKind = ShedKind.BUDGET):
        super().__init__(message)
        self.retry_after = retry_after
        self.kind = kind
