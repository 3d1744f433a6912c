"""Announce, or leave it to the relay: every hand-over of committed rows to Redis goes through
`announce_or_leave_to_relay`. The rows are committed first, so Redis not answering loses
nothing: it is logged, and the relay hands the rows over after its grace period."""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("shop.outbox")


def announce_or_leave_to_relay(announce: Callable[[], object], what: str, *args) -> bool:
    """Call `announce` (which tells Redis about rows already committed); True when it did. When
    Redis does not answer, log `what % args` (what is due) and return False: the relay will."""
    try:
        announce()
        return True
    except Exception as exc:  # Redis down: the rows are committed, the relay will announce them.
        log.warning(what + ", but Redis could not be told (%s); the relay will pick it up", *args, exc)
        return False
