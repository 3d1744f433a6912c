"""Typed outcomes for guarded operations: an expected refusal is a value, not an exception."""

from __future__ import annotations

from dataclasses import dataclass, field


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
