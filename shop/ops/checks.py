"""One line of the preflight (`flask shop check`, docs/REFERENCE.md, Commands): a `Check`, its
statuses, how long every service is given to answer, and how an error reads in one line."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "ok", "warn", "fail"
LABELS = {OK: "ok", WARN: "warn", FAIL: "FAIL"}
# Every service gets this long to answer (the provider a little longer: it is across the internet).
TIMEOUT_SECONDS = 3.0
PROVIDER_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
