"""Typed outcomes for guarded operations: an expected refusal is a value, not an exception."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class Ok:
    events: tuple = ()

    ok = True


@dataclass(frozen=True)
class Refused:
    code: str
    message: str
    details: dict = field(default_factory=dict)

    ok = False


class SubmissionOutcome(StrEnum):
    """What an operator's submission (one request key: a stock correction, an email resent, a
    refund) did: done; already (this very submission was done before: nothing more); refused
    (the use case says why); missing (no such order, or variant)."""

    DONE = "done"
    ALREADY = "already"
    REFUSED = "refused"
    MISSING = "missing"
