"""The turns in which the payment queue's calls take the rate budget (`Turnstile`, `Ticket`): the
line's order kept across the threads that make the calls. A call's context (calls.py) carries its
ticket; nothing here reads the context, so the two never import each other."""

from __future__ import annotations

import threading
import time

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
