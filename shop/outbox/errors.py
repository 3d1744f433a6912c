"""What a handler or a scheduled command raises to tell the runner how an attempt ended. Its own
module, importing nothing of the shop but the domain, so a use case can raise them at top level
without importing the runner."""
from __future__ import annotations

from datetime import datetime

from ..domain.deadlines import FAILURE_REFUSED


class PermanentFailure(Exception):
    """A handler's way to say "retrying cannot help": the row goes straight to dead."""

    failure_kind = FAILURE_REFUSED


class Reschedule(Exception):
    """Not due yet (a scheduler may fire up to a second early): run again at `due`, without
    spending an attempt."""

    def __init__(self, due: datetime):
        super().__init__(f"not due until {due.isoformat()}")
        self.due = due
