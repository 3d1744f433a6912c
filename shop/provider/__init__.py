"""The payment provider's adapter: every call to Stripe (`gateway.py`, a held payment's capture
and void in `holds.py`, each through `guarded.py`, over `transport.py`; the breaker's probe and the
preflight's read in `probe.py`), the guard that stands before each call (`guard/`), what the
provider says as plain values (`views.py`, `payment_view.py`) and its failures (`errors.py`), a
webhook's signature (`signature.py`), webhook endpoint registration, the provider watch, the shop's
mark on its sessions and the console's links to them. The only package that imports `stripe`; it
imports no use case."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from flask import Flask

from . import guard, probe


def init_app(app: Flask, *, wake_waiting_work: Callable[[datetime], object]) -> None:
    """Wire the provider into the app: the guard's per-request time budget, and what wakes the
    work that waited for the provider when the breaker's probe or the watch sees it answer again
    (create_app hands in the outbox's wake-up: this package imports no use case)."""
    guard.init_app(app)
    probe.init_app(app, wake_waiting_work)
