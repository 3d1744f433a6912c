"""The prober: while the breaker is not closed, one thread per process asks for the shop's one
probe (`Breaker.claim_probe`, at most one per PROBE_SPACING_SECONDS across every process) and, when
it holds it, makes it (a cheap read, `provider.probe.probe`); its first success closes the breaker for
every process."""

from __future__ import annotations

import logging
import threading

from .breaker import PROBE_POLL_SECONDS, PROBE_SPACING_SECONDS, Breaker, BreakerState

log = logging.getLogger("shop.payments.guard")


class Prober:
    def __init__(self, breaker: Breaker):
        self.breaker = breaker
        self._prober: threading.Thread | None = None
        self._prober_lock = threading.Lock()
        self._closed = threading.Event()

    def watch_for_recovery(self, app, probe, on_recovered=None) -> None:
        """Make sure this process has a prober thread while the breaker is not closed: it asks
        for the shop's one probe (claim_probe) every PROBE_POLL_SECONDS and, when it holds it,
        calls `probe()` (True: the provider answered; False: it failed; None: could not try)
        inside `app`'s context, then records the result. It ends once the breaker is closed,
        calling `on_recovered()` if its own probe closed it. Cheap to call on every refusal."""
        thread = self._prober
        if thread is not None and thread.is_alive():
            return
        with self._prober_lock:
            if self._prober is not None and self._prober.is_alive():
                return
            self._prober = threading.Thread(
                target=self._probe_until_closed, args=(app, probe, on_recovered), name="provider-prober", daemon=True
            )
            self._prober.start()

    def _probe_until_closed(self, app, probe, on_recovered) -> None:
        with app.app_context():
            while not self._closed.is_set():
                try:
                    turn = self.breaker.claim_probe()
                    if turn.closed:
                        return
                    if not turn.mine:
                        self._closed.wait(min(max(turn.wait, 0.02), PROBE_POLL_SECONDS))
                        continue
                    answered = probe()
                    if answered is None:  # no slot or no budget for it now: the claim lapses, ask again
                        self._closed.wait(PROBE_POLL_SECONDS)
                        continue
                    if self.breaker.probe_result(answered) is BreakerState.CLOSED and answered:
                        log.warning("payment provider answers again: the circuit breaker is closed for every process")
                        if on_recovered is not None:
                            on_recovered()
                        return
                except Exception:  # noqa: BLE001 - a prober must outlive any one bad round
                    log.exception("provider prober: a round failed; trying again")
                    self._closed.wait(PROBE_SPACING_SECONDS)

    def close(self) -> None:
        """Stop this guard's prober (an app being thrown away: tests)."""
        self._closed.set()
