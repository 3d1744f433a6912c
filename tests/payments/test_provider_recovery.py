"""The provider answering again wakes the work that backed off for it (docs/ARCHITECTURE.md, the
outbox's dead letters: "A provider that answers again makes every row waiting for it due at
once"). The wake-up is the outbox's, handed to the provider by create_app (shop.provider.init_app):
the provider package imports no use case and no outbox. Real database, Redis and sandbox."""

from __future__ import annotations

from datetime import timedelta

from shop.domain.deadlines import FAILURE_ERROR, FAILURE_PROVIDER, as_utc, utcnow
from shop.extensions import db
from shop.models import CommandKind, ScheduledCommand
from shop.provider import guard, probe, watch


def _refund_command(next_attempt_at, **fields) -> int:
    row = ScheduledCommand(
        kind=CommandKind.REFUND_PAYMENT,
        order_id=None,
        payload={"refund_id": 0},
        next_attempt_at=next_attempt_at,
        **fields,
    )
    db.session.add(row)
    db.session.commit()
    return row.id


def _due(command_id: int) -> bool:
    db.session.expire_all()
    return as_utc(db.session.get(ScheduledCommand, command_id).next_attempt_at) <= utcnow()


def test_the_watch_finding_the_provider_back_closes_the_breaker_and_makes_waiting_work_due_at_once(make_shop, sandbox):
    app = make_shop(sandbox=True)
    with app.app_context():
        later = utcnow() + timedelta(seconds=250)
        waiting = _refund_command(
            later, failure_kind=FAILURE_PROVIDER, provider_waits=3, last_error="waiting for the provider"
        )
        erring = _refund_command(later, failure_kind=FAILURE_ERROR, attempts=1, last_error="ValueError")
        provider_guard = guard.get()
        for _ in range(app.config["STRIPE_BREAKER_THRESHOLD"]):
            provider_guard.record(ok=False)
        assert provider_guard.breaker_view()["state"] == guard.OPEN
        assert not _due(waiting)

        assert watch.check_now() is True  # the sandbox answers the watch's read

        assert provider_guard.breaker_view()["state"] == guard.CLOSED
        assert _due(waiting), "the row that waited for the provider still waits out its backoff"
        assert not _due(erring), "a row retrying its own error was woken too"
        row = db.session.get(ScheduledCommand, waiting)
        assert (row.attempts, row.provider_waits) == (0, 3)  # woken, not spent


def test_what_the_provider_wakes_on_recovery_is_what_the_app_handed_it(make_shop):
    app = make_shop()
    woken_at = []
    with app.app_context():
        probe.init_app(app, woken_at.append)
        before = utcnow()
        probe.recovered()
    assert len(woken_at) == 1 and woken_at[0] >= before
