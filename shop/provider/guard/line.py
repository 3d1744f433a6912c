"""The line for payment sessions (payments.checkout_queue): while orders wait in it, a customer's
new session is not created ahead of them (the budget refuses it as `Shed(kind=LINE)` and the order
joins the line); and the turns in which the payment queue's calls take the budget (`Turnstile`).
"""

from __future__ import annotations

import threading
import time

from ... import clock
from .calls import Priority, current
from .shared import SharedRedis

# After meeting the line held, a process sends its customers' new sessions to it directly for this
# long (see Line.seen_held); a line that opened meanwhile serves them first anyway.
LINE_SEEN_SECONDS = 0.5
# How long a turn waits for the ones before it (see Turnstile).
TURN_PATIENCE_SECONDS = 2.0


class Turnstile:
    """Lets a process's calls take the rate budget in the order their tickets were issued: the
    payment queue issues them in the line's arrival order, and its calls run on several threads
    at once (the provider's latency), so without turns the budget would go to whichever thread
    asked first. A turn not taken within TURN_PATIENCE_SECONDS is skipped, so a call held up
    before its request (a slow database) delays the others only that long."""

    def __init__(self):
        self._changed = threading.Condition()
        self._issued = 0
        self._serving = 0
        self._finished: set[int] = set()

    def ticket(self) -> Ticket:
        with self._changed:
            number, self._issued = self._issued, self._issued + 1
        return Ticket(self, number)

    def _wait(self, number: int) -> None:
        # The real clock: a hand-off between this process's threads, not a limit on the provider.
        give_up = time.monotonic() + TURN_PATIENCE_SECONDS
        with self._changed:
            while self._serving < number and time.monotonic() < give_up:
                self._changed.wait(give_up - time.monotonic())

    def _finish(self, number: int) -> None:
        with self._changed:
            self._finished.add(number)
            while self._serving in self._finished:
                self._finished.discard(self._serving)
                self._serving += 1
            self._changed.notify_all()


class Ticket:
    """One call's place in a Turnstile: its first budget request waits for its turn; `release`
    gives the turn up when the call ends without one."""

    def __init__(self, turnstile: Turnstile, number: int):
        self._turnstile, self.number, self.used = turnstile, number, False

    def take(self, take):
        self.used = True
        self._turnstile._wait(self.number)
        try:
            return take()
        finally:
            self._turnstile._finish(self.number)

    def release(self) -> None:
        if not self.used:
            self.used = True
            self._turnstile._finish(self.number)


class Line:
    """The line's hold on new sessions: a key in Redis (`key`) while anyone waits, and whether this
    process met it held a moment ago."""

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
        self.shared.command(lambda conn: conn.set(self.key, 1, px=max(1, int(seconds * 1000))))

    def open(self) -> None:
        """Nobody waits in line any more: customers' sessions are created at once again."""
        self.shared.command(lambda conn: conn.delete(self.key))
