"""The per-order payment deadline: armed with the order (in the database only), re-derived from
what is stored when it fires, re-armed after a failed payment, a lost race to a webhook, found by
the scheduler's poll and run by a command drain, and nothing to recover after Redis lost
everything. Real database, real Redis, real sandbox; time is injected through `now=`."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, select

from factories import on_hand, place_order_for, seed_catalog_rows, transitioned, variant_id
from shop import SettingsError, create_app, queue
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.order import Transition as T
from shop.extensions import db
from shop.models import Order, OutboxDelivery, OutboxEvent, ScheduledCommand
from shop.orders.cancel import PROVIDER_EXPIRY_GRACE, PROVIDER_FIRST_LOOK
from shop.outbox.dispatch import drain_commands, run_command, run_delivery
from shop.outbox.relay import relay_once, wake_due_work
from shop.outbox.runner import COMMAND_LOOKAHEAD_SECONDS
from shop.payments.apply import reconcile_order
from shop.payments.start import start_payment
from shop.provider import gateway
from support import wait_until

pytestmark = pytest.mark.usefixtures("no_order_placed_email")


WINDOW = 1800  # the default payment window
HOLD = 600  # the default hold of an order that never had a payment session (PendingPayment)
SKU = "MUG-350-SND"  # 12 in stock after seeding


def _checkout(quantity: int = 2, now: datetime | None = None) -> tuple[int, int, int]:
    """Place a real order for `quantity` of SKU; returns (order id, variant id, deadline id)."""
    seed_catalog_rows()
    placed = place_order_for({SKU: quantity}, now=now)
    deadline_id = db.session.execute(
        select(ScheduledCommand.id).where(
            ScheduledCommand.kind == "expire_unpaid_order", ScheduledCommand.order_id == placed.order_id
        )
    ).scalar_one()
    db.session.rollback()
    return placed.order_id, variant_id(SKU), deadline_id


def _order(order_id: int) -> Order:
    db.session.expire_all()
    return db.session.get(Order, order_id)


def _command(command_id: int) -> ScheduledCommand:
    db.session.expire_all()
    return db.session.get(ScheduledCommand, command_id)


def _deadlines(order_id: int) -> list[ScheduledCommand]:
    db.session.expire_all()
    return list(
        db.session.execute(
            select(ScheduledCommand)
            .where(ScheduledCommand.kind == "expire_unpaid_order", ScheduledCommand.order_id == order_id)
            .order_by(ScheduledCommand.id)
        ).scalars()
    )


def _deliveries(order_id: int, event_name: str) -> list[OutboxDelivery]:
    db.session.expire_all()
    return list(
        db.session.execute(
            select(OutboxDelivery)
            .join(OutboxEvent, OutboxDelivery.event_id == OutboxEvent.id)
            .where(OutboxEvent.order_id == order_id, OutboxEvent.name == event_name)
            .order_by(OutboxDelivery.id)
        ).scalars()
    )


def _woke(now: datetime) -> list[str]:
    """What the scheduler's poll at `now` wakes: a drain of commands, of deliveries, both or none."""
    return wake_due_work(now=now)["woke"]


def _restore(order_id: int, now: datetime) -> None:
    [delivery] = [d for d in _deliveries(order_id, "OrderCancelled") if d.handler == "restore_inventory"]
    assert run_delivery(delivery.id, now=now) == "done"


@pytest.fixture
def app_ctx(fresh_app):
    with fresh_app.app_context():
        yield fresh_app
        db.session.remove()


@pytest.fixture
def paying_ctx(fresh_paying_app):
    with fresh_paying_app.app_context():
        yield fresh_paying_app
        db.session.remove()


def test_an_unpaid_order_is_cancelled_at_its_deadline_and_its_stock_comes_back(app_ctx):
    placed_at = utcnow()
    order_id, variant_id, deadline_id = _checkout(quantity=2, now=placed_at)
    assert on_hand(variant_id) == 10
    due = as_utc(_command(deadline_id).next_attempt_at)
    assert due == placed_at + timedelta(seconds=HOLD)  # no payment session yet: the short hold

    assert run_command(deadline_id, now=due) == "done"

    order = _order(order_id)
    assert order.status == "Cancelled"
    assert _command(deadline_id).status == "done"
    _restore(order_id, now=due)
    assert on_hand(variant_id) == 12
    assert _order(order_id).inventory_restored is True


def test_a_deadline_that_fires_a_second_early_is_rescheduled_to_its_due_time_and_then_cancels(app_ctx):
    placed_at = utcnow()
    order_id, variant_id, deadline_id = _checkout(now=placed_at)
    due = placed_at + timedelta(seconds=HOLD)

    # A job by id (as older releases enqueued through rq-scheduler, which may move a job up to a
    # second early) claims it a little before its time, and hands it back.
    assert run_command(deadline_id, now=due - timedelta(seconds=1.5)) == "rescheduled"

    assert _order(order_id).status == "PendingPayment"
    row = _command(deadline_id)
    assert (row.status, row.attempts, as_utc(row.next_attempt_at)) == ("pending", 0, due)
    assert _deliveries(order_id, "OrderCancelled") == []
    # A drain claims nothing before its time, and the poll wakes none.
    assert drain_commands(now=due - timedelta(seconds=1)).get("done", 0) == 0
    assert _woke(due - timedelta(seconds=1)) == []
    assert _woke(due) == ["commands"]

    assert run_command(deadline_id, now=due) == "done"
    assert _order(order_id).status == "Cancelled"
    _restore(order_id, now=due)
    assert on_hand(variant_id) == 12


def test_a_deadline_run_long_before_its_time_changes_nothing(app_ctx):
    placed_at = utcnow()
    order_id, variant_id, deadline_id = _checkout(now=placed_at)

    assert run_command(deadline_id, now=placed_at + timedelta(minutes=5)) == "skipped"

    order = _order(order_id)
    assert (order.status, order.version) == ("PendingPayment", 1)
    assert _command(deadline_id).status == "pending"
    assert on_hand(variant_id) == 10


def test_a_payment_that_failed_at_minute_5_gets_a_fresh_full_window_and_the_old_deadline_is_a_noop(paying_ctx):
    # The order was placed 5 minutes ago, within its hold; its payment (started by "Pay now")
    # fails now ("minute 5").
    minute_5 = utcnow()
    placed_at = minute_5 - timedelta(minutes=5)
    order_id, variant_id, old_id = _checkout(now=placed_at)
    assert start_payment(order_id, now=minute_5).status == "started"
    session_id = _order(order_id).payment_session_id
    gateway.expire_session(session_id)
    assert reconcile_order(order_id, source="test", now=minute_5).outcome == "payment_failed"
    [followups] = _deliveries(order_id, "OrderPaymentFailed")
    # At its due time (written just after minute_5): a delivery is never claimed early.
    ran_at = as_utc(followups.next_attempt_at)
    assert run_delivery(followups.id, now=ran_at) == "done"

    failed = _order(order_id)
    failed_version, failed_at = failed.version, as_utc(failed.updated_at)
    assert failed.status == "PaymentFailed"
    old, new = _deadlines(order_id)
    old_due, new_id, new_due = as_utc(old.next_attempt_at), new.id, as_utc(new.next_attempt_at)
    assert old.id == old_id
    assert old_due == placed_at + timedelta(seconds=HOLD)  # minute 10: the end of its hold
    # A full window from the failure (from when the follow-up ran, if that was later).
    assert new_due == max(failed_at, ran_at) + timedelta(seconds=WINDOW)
    # ... and the failure is the one this test made at minute 5, not the order's placing: its
    # time lies between then and now, however long the machine took to get here.
    assert minute_5 <= max(failed_at, ran_at) <= utcnow()

    # Minute 10: the first deadline fires and does nothing.
    assert run_command(old_id, now=old_due) == "done"
    still = _order(order_id)
    assert (still.status, still.version) == ("PaymentFailed", failed_version)
    assert _deliveries(order_id, "OrderCancelled") == []
    assert on_hand(variant_id) == 10

    # Minute 35: the fresh deadline cancels and the stock comes back.
    assert run_command(new_id, now=new_due) == "done"
    assert _order(order_id).status == "Cancelled"
    _restore(order_id, now=new_due)
    assert on_hand(variant_id) == 12


def test_a_deadline_for_an_order_paid_meanwhile_is_a_noop(paying_ctx, sandbox):
    placed_at = utcnow()
    order_id, variant_id, deadline_id = _checkout(now=placed_at)
    assert start_payment(order_id, now=placed_at).status == "started"
    sandbox.set_outcome(_order(order_id).payment_session_id, "paid")
    assert reconcile_order(order_id, source="test").outcome == "paid"
    paid_version = _order(order_id).version

    # Retired when the order was paid (see the tests below): not even claimable any more.
    assert run_command(deadline_id, now=placed_at + timedelta(seconds=WINDOW)) == "skipped"
    assert _command(deadline_id).status == "obsolete"

    order = _order(order_id)
    assert (order.status, order.version) == ("Paid", paid_version)
    assert _deliveries(order_id, "OrderCancelled") == []
    assert on_hand(variant_id) == 10


def test_a_deadline_is_armed_in_the_database_only_and_costs_redis_nothing(app_ctx, redis_conn):
    before = set(redis_conn.keys("*"))
    order_id, _, deadline_id = _checkout()
    row = _command(deadline_id)
    assert (row.status, row.order_id) == ("pending", order_id)
    assert queue.scheduler().count() == 0 and queue.work_queue().count == 0
    assert set(redis_conn.keys("*")) == before
    db.session.rollback()


def test_an_order_paid_before_its_deadline_retires_it_at_once_and_it_is_never_run(paying_ctx, sandbox, redis_conn):
    placed_at = utcnow()
    order_id, _, deadline_id = _checkout(now=placed_at)
    assert start_payment(order_id, now=placed_at).status == "started"
    sandbox.set_outcome(_order(order_id).payment_session_id, "paid")

    # The payment's own path (the webhook's fast path: prebuilt statements, events written directly).
    assert reconcile_order(order_id, source="test").outcome == "paid"

    [row] = _deadlines(order_id)
    assert (row.status, row.completed_at is not None) == ("obsolete", True)
    assert "paid before its deadline" in row.discard_reason
    # Nothing can bring it back: the poll, the relay and a drain look for pending rows only.
    due = placed_at + timedelta(seconds=WINDOW + 1)
    assert "commands" not in _woke(due)
    assert relay_once(now=due)["commands"] == 0
    assert drain_commands(now=due).get("done", 0) == 0
    assert _command(deadline_id).status == "obsolete"
    db.session.rollback()


def test_a_cancelled_order_retires_its_pending_deadline_with_its_cancellation(app_ctx, redis_conn):
    from shop.orders.cancel import cancel_order

    order_id, _, deadline_id = _checkout()
    assert cancel_order(order_id, None).status == "cancelled"

    [row] = _deadlines(order_id)
    assert row.status == "obsolete" and "cancelled before its deadline" in row.discard_reason
    # Written by the same commit as the cancellation's event (one `now` for both).
    [cancelled] = db.session.scalars(
        select(OutboxEvent).where(OutboxEvent.order_id == order_id, OutboxEvent.name == "OrderCancelled")
    ).all()
    assert as_utc(row.completed_at) == as_utc(cancelled.created_at)
    db.session.rollback()
    assert drain_commands(now=utcnow() + timedelta(seconds=WINDOW + 1)).get("done", 0) == 0
    assert _command(deadline_id).status == "obsolete"


def _at_the_payment_page(placed_at):
    """An order placed at `placed_at` whose customer went to the hosted page at once; returns
    (order id, variant id, deadline id, session id, the session's expires_at)."""
    order_id, variant_id, deadline_id = _checkout(now=placed_at)
    assert start_payment(order_id, now=placed_at).status == "started"
    order = _order(order_id)
    sid, expires = order.payment_session_id, as_utc(order.payment_session_expires_at)
    db.session.rollback()
    return order_id, variant_id, deadline_id, sid, expires


def test_the_deadline_of_an_order_at_the_payment_page_waits_for_its_session_then_cancels_it(paying_ctx, sandbox):
    """The expired webhook never came (this app has no endpoint at the sandbox): the order's own
    deadline waits for the session's expires_at, asks the provider, and cancels."""
    placed_at = utcnow()
    order_id, variant_id, deadline_id, sid, expires = _at_the_payment_page(placed_at)
    assert abs((expires - (placed_at + timedelta(seconds=WINDOW))).total_seconds()) <= 1  # pay-by = session end

    # At the session's end (its expires_at is whole seconds, up to one before the window's end).
    assert run_command(deadline_id, now=expires) == "rescheduled"
    row = _command(deadline_id)
    assert (row.status, row.attempts, as_utc(row.next_attempt_at)) == ("pending", 0, expires + PROVIDER_FIRST_LOOK)
    # Alone (no group of deadlines due with it), it gives the provider its grace before asking.
    before = sandbox.requests()
    assert run_command(deadline_id, now=expires + PROVIDER_FIRST_LOOK) == "rescheduled"
    row = _command(deadline_id)
    assert (row.status, row.attempts, as_utc(row.next_attempt_at)) == ("pending", 0, expires + PROVIDER_EXPIRY_GRACE)
    assert sandbox.requests()[len(before) :] == []
    assert _order(order_id).status == "PaymentInitiated"

    sandbox.advance_clock((expires - utcnow()).total_seconds() + 1)  # the provider expires it at its time
    assert gateway.retrieve_session(sid).status == "expired"
    at = expires + timedelta(seconds=2)
    assert run_command(deadline_id, now=at) == "done"
    cancelled = _order(order_id)
    assert cancelled.status == "Cancelled"
    [event] = [
        e
        for e in db.session.scalars(select(OutboxEvent).where(OutboxEvent.order_id == order_id))
        if e.name == "OrderCancelled"
    ]
    assert event.payload["reason"] == "payment window expired"
    db.session.rollback()
    _restore(order_id, now=at)
    assert on_hand(variant_id) == 12


def test_a_payment_made_just_before_the_session_expired_wins_over_the_deadline(paying_ctx, sandbox):
    placed_at = utcnow()
    order_id, variant_id, deadline_id, sid, expires = _at_the_payment_page(placed_at)
    sandbox.set_outcome(sid, "paid")  # its webhook never reaches this app

    assert run_command(deadline_id, now=expires + timedelta(seconds=2)) == "done"

    assert _order(order_id).status == "Paid"
    assert _deliveries(order_id, "OrderCancelled") == []
    assert on_hand(variant_id) == 10


def test_a_deadline_finding_the_session_still_open_at_the_provider_asks_again_shortly(paying_ctx, sandbox):
    placed_at = utcnow()
    order_id, _variant_id, deadline_id, _sid, expires = _at_the_payment_page(placed_at)
    at = expires + timedelta(seconds=2)  # the sandbox's clock has not reached expires_at: still open there

    assert run_command(deadline_id, now=at) == "rescheduled"

    row = _command(deadline_id)
    assert (row.status, as_utc(row.next_attempt_at)) == ("pending", at + timedelta(seconds=15))
    assert _order(order_id).status == "PaymentInitiated"


def test_a_deadline_whose_provider_budget_is_spent_is_asked_again_at_its_turn_not_waited_for(
    make_fresh_app, sandbox, fake_clock
):
    """A deadline that must ask the provider, when the endpoint's budget is spent, goes back to
    pending for when the budget frees up (no attempt spent, no provider failure counted) instead
    of holding the drain's thread, and the sessionless deadlines behind it, until then. The budget
    runs on a clock that stands still: on Redis's own, a loaded second between the call that
    spends it and the deadline's refills it, and the deadline asks the provider after all."""
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_SESSION_MIN_SECONDS=60,
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=1,
        CLOCK=fake_clock,
    )
    with app.app_context():
        placed_at = utcnow()
        order_id, _variant_id, deadline_id, sid, expires = _at_the_payment_page(placed_at)
        gateway.retrieve_session(sid)  # the one call this endpoint allows in its window
        at = expires + timedelta(seconds=2)

        assert run_command(deadline_id, now=at) == "rescheduled"

        row = _command(deadline_id)
        assert (row.status, row.attempts, row.failure_kind, row.provider_waits) == ("pending", 0, None, 0)
        wait = (as_utc(row.next_attempt_at) - at).total_seconds()
        assert 0.05 <= wait <= 1.5 + 2.0  # the budget's next call (one window at most), plus the spread
        assert _order(order_id).status == "PaymentInitiated"
        db.session.remove()


def test_a_deadline_that_loses_a_race_to_a_webhook_completes_without_retrying(app_ctx, is_postgres):
    if not is_postgres:
        pytest.skip("SQLite serialises writers (BEGIN IMMEDIATE): the interleaving cannot happen there")
    placed_at = utcnow()
    order_id, variant_id, deadline_id = _checkout(now=placed_at)
    app = app_ctx
    raced = []

    def webhook_pays_right_after_the_deadline_loaded_the_order(target, _context):
        # Another writer (a webhook, in its own session and transaction) pays the order between
        # the deadline's load and its save.
        if target.id != order_id or raced:
            return
        raced.append(True)
        with app.app_context():
            transitioned(
                order_id,
                (T.START_PAYMENT, lambda o: o.start_payment("cs_race", None)),
                (T.MARK_PAID, lambda o: o.mark_paid("cs_race", o.total, o.currency)),
            )
            db.session.remove()

    event.listen(Order, "load", webhook_pays_right_after_the_deadline_loaded_the_order)
    try:
        result = run_command(deadline_id, now=placed_at + timedelta(seconds=WINDOW))
    finally:
        event.remove(Order, "load", webhook_pays_right_after_the_deadline_loaded_the_order)

    assert raced, "the other writer never ran"
    assert result == "done"
    row = _command(deadline_id)
    assert (row.status, row.attempts, row.last_error) == ("done", 1, None)  # completed, not retried
    order = _order(order_id)
    assert (order.status, order.payment_session_id) == ("Paid", "cs_race")
    assert _deliveries(order_id, "OrderCancelled") == []
    assert on_hand(variant_id) == 10


def test_a_deadline_falling_due_after_a_redis_wipe_is_found_by_the_next_poll_and_runs(app_ctx, redis_conn):
    # Placed so that its deadline falls due two seconds from now, on the real clock a worker uses.
    placed_at = utcnow() - timedelta(seconds=HOLD - 2)
    order_id, variant_id, deadline_id = _checkout(now=placed_at)
    due = as_utc(_command(deadline_id).next_attempt_at)

    redis_conn.flushdb()  # Redis loses everything: there was nothing of the deadline in it
    # A poll before its time (and before the drain's lookahead) wakes nothing: asked at that time,
    # not at the real clock's now, which a slow checkout on a loaded machine may carry past it.
    assert "commands" not in _woke(due - timedelta(seconds=COMMAND_LOOKAHEAD_SECONDS + 1))
    wait_until(lambda: utcnow() >= due, 5, "the deadline to fall due on the real clock")
    assert _woke(utcnow()) == ["commands"]  # the poll after its time
    queue.run_worker(burst=True)  # the command drain, then the delivery drain it woke

    order = _order(order_id)
    assert (order.status, order.inventory_restored) == ("Cancelled", True)
    assert _command(deadline_id).status == "done"
    assert on_hand(variant_id) == 12


def test_a_due_deadline_whose_wake_up_redis_lost_runs_late_but_runs(app_ctx, redis_conn):
    # Placed 31 minutes ago: the deadline came due a minute ago while Redis had lost its drain.
    placed_at = utcnow() - timedelta(minutes=31)
    order_id, variant_id, deadline_id = _checkout(now=placed_at)
    redis_conn.flushdb()
    assert queue.work_queue().count == 0

    counts = relay_once()  # the scheduler's start-up (a poll would do as well)
    assert counts["commands"] == 1
    queue.run_worker(burst=True)  # drains the command, then the OrderCancelled delivery it raised

    order = _order(order_id)
    assert (order.status, order.inventory_restored) == ("Cancelled", True)
    assert _command(deadline_id).status == "done"
    assert on_hand(variant_id) == 12


def _periodic(prefix: str) -> dict[str, int]:
    return {
        job.id: job.meta.get("interval")
        for job in queue.scheduler().get_jobs()
        if job.id.startswith(f"{prefix}-periodic-")
    }


def test_registering_periodic_jobs_again_is_idempotent_and_a_new_interval_replaces_the_old(app_ctx):
    prefix = app_ctx.config["QUEUE_PREFIX"]
    relay_id, sweep_id = f"{prefix}-periodic-relay", f"{prefix}-periodic-reconcile"

    queue.register_periodic_jobs(5, 600)
    assert _periodic(prefix) == {relay_id: 5, sweep_id: 600}

    lines = queue.register_periodic_jobs(5, 600)  # a scheduler restart
    assert _periodic(prefix) == {relay_id: 5, sweep_id: 600}
    assert all("kept" in line for line in lines)

    queue.run_scheduler(burst=True)  # both are due now: moved to the control queue...
    queue.run_worker(burst=True)  # ...and run; a periodic job must outlive its own run
    assert _periodic(prefix) == {relay_id: 5, sweep_id: 600}

    queue.register_periodic_jobs(5, 300)  # the interval changed between deployments
    assert _periodic(prefix) == {relay_id: 5, sweep_id: 300}

    queue.register_periodic_jobs(5, None)  # both sweep gates off
    assert _periodic(prefix) == {relay_id: 5}


def test_the_app_refuses_to_start_when_the_stuck_age_differs_from_the_window(database_url):
    env = {
        "DATABASE_URL": database_url,
        "SECRET_KEY": "x",
        "UNPAID_ORDER_EXPIRY_SECONDS": "1800",
        "RECONCILIATION_STUCK_AGE_SECONDS": "600",
    }
    with pytest.raises(SettingsError) as refused:
        create_app(env=env)
    assert refused.value.variable == "RECONCILIATION_STUCK_AGE_SECONDS"
    assert "RECONCILIATION_STUCK_AGE_SECONDS" in str(refused.value)
    assert (
        create_app(env={**env, "RECONCILIATION_STUCK_AGE_SECONDS": "1800"}).config["RECONCILIATION_STUCK_AGE_SECONDS"]
        == 1800
    )
