"""The line for payment sessions (payments.checkout_queue): while orders wait in it, a customer's
new session is not created ahead of them (the budget refuses it as `Shed(kind=LINE)` and the order
joins the line). The turns in which the payment queue's calls take the budget are `turns.py`'s.
"""

from __future__ import annotations

from ... import clock
from .calls import Priority, current
from .shared import _REDIS_NOW, SharedRedis

# After meeting the line held, a process sends its customers' new sessions to it directly for this
# long (see Line.seen_held); a line that opened meanwhile serves them first anyway.
LINE_SEEN_SECONDS = 0.5
# The line's key outlives its hold by this much: the budget's script reads the time in it, not
# whether it exists, and a key gone with its hold would stop a clock set by hand from holding it.
LINE_KEY_SLACK_SECONDS = 60.0

# Hold the line until `now` + ARGV[1] seconds, on the clock every budget script runs on (Redis's,
# or one set by hand): the budget compares that time with its own `now`, so the hold lapses when
# the budget's clock says so, not by the key's expiry on Redis's wall clock.
_LINE_HOLD = (
    _REDIS_NOW
    + """
redis.call('SET', KEYS[1], tostring(now + tonumber(ARGV[1])), 'PX', tonumber(ARGV[2]))
return 1
"""
)


class Line:
    """The line's hold on new sessions: a key in Redis (`key`) holding the time it lapses, and
    whether this process met it held a moment ago."""

    def __init__(self, shared: SharedRedis, key: str):
        self.shared = shared
        self.key = key
        self._seen_until = 0.0  # the clock's monotonic(): this process met the line held until then

    def saw_held(self) -> None:
        """The budget refused a call for the line: remember it for LINE_SEEN_SECONDS."""
        self._seen_until = clock.current().monotonic() + LINE_SEEN_SECONDS

    def seen_held(self) -> bool:
        """Did this process meet the line held within the last LINE_SEEN_SECONDS? A customer's
        new session then joins the line at once, without building a request only to have it
        refused (a checkout in a sale would otherwise spend a few ms of CPU on each)."""
        return (
            current().priority is Priority.CUSTOMER
            and not current().in_line
            and clock.current().monotonic() < self._seen_until
        )

    def hold(self, seconds: float) -> None:
        """Orders wait in line for a payment session: for the next `seconds`, a customer's new
        session is not created ahead of them (take_token's `behind_line`). The payment queue
        renews it while anyone waits; it lapses by itself (a Redis that lost it only lets a few
        checkouts go first until the next renewal)."""
        self.shared.run("line_hold", _LINE_HOLD, [self.key], [seconds, int((seconds + LINE_KEY_SLACK_SECONDS) * 1000)])

    def open(self) -> None:
        """Nobody waits in line any more: customers' sessions are created at once again."""
        self.shared.command(lambda conn: conn.delete(self.key))
