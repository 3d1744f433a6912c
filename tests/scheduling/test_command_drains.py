"""Scheduled commands (deadlines, emails, refunds) are found by the scheduler's poll and run by
command drains that claim them from the database in batches: one RQ job for whatever fell due,
never one per row. What must hold: a burst of due deadlines wakes one drain, not a job each; any
number of pollers and drains never run a command twice; a command held by a worker that died
(on any machine) is taken over once its lease lapses, and not before."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

import shop.scheduling.commands
from factories import place_order_for, seed_catalog_rows
from shop import queue
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import CommandKind, Order, ScheduledCommand
from shop.outbox.dispatch import drain_commands
from shop.outbox.relay import wake_due_work
from shop.outbox.writer import schedule_command

pytestmark = pytest.mark.usefixtures("no_order_placed_email")


WINDOW = 1800


def _place_unpaid(n: int, placed_at) -> list[int]:
    a5 = seed_catalog_rows()["NB-A5-DOT"]
    orders = [place_order_for({a5: 1}, now=placed_at).order_id for _ in range(n)]
    db.session.remove()
    return orders


def _statuses(model, column, value) -> list[str]:
    db.session.expire_all()
    rows = db.session.execute(select(model.status).where(column == value)).scalars().all()
    db.session.rollback()
    return rows


def test_a_burst_of_due_deadlines_wakes_one_drain_job_that_cancels_every_order_once(fresh_app, redis_conn):
    with fresh_app.app_context():
        orders = _place_unpaid(25, utcnow() - timedelta(seconds=WINDOW + 5))
        redis_conn.flushdb()  # whatever the placements woke is gone: only the poll is left

        for _ in range(4):  # four polls (several schedulers, or one polling on)
            assert wake_due_work()["woke"] == ["commands"]
        jobs = queue.work_queue().jobs
        assert [j.func_name for j in jobs] == [queue.COMMAND_DRAIN_JOB] * queue.DRAIN_SLOTS

        queue.run_worker(burst=True)

        db.session.expire_all()
        statuses = db.session.execute(select(Order.status).where(Order.id.in_(orders))).scalars().all()
        assert statuses == ["Cancelled"] * 25
        restored = db.session.execute(
            select(func.count()).where(Order.id.in_(orders), Order.inventory_restored.is_(True))
        ).scalar_one()
        assert restored == 25
        deadlines = db.session.execute(
            select(ScheduledCommand.status, ScheduledCommand.attempts).where(
                ScheduledCommand.kind == "expire_unpaid_order"
            )
        ).all()
        assert set(deadlines) == {("done", 1)} and len(deadlines) == 25
        db.session.remove()


def test_concurrent_command_drains_never_run_one_command_twice(fresh_app, monkeypatch):
    runs, lock = [], threading.Lock()

    def counting(row, now):
        with lock:
            runs.append(row.payload["n"])

    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "counting", counting)
    now = utcnow()
    with fresh_app.app_context():
        for n in range(40):
            schedule_command(db.session, "counting", now, payload={"n": n}, now=now)
        db.session.commit()
        db.session.remove()
    barrier = threading.Barrier(3)
    results = []

    def drain():
        with fresh_app.app_context():
            barrier.wait()
            results.append(drain_commands(now=now + timedelta(seconds=1), batch_size=4))

    threads = [threading.Thread(target=drain) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(runs) == list(range(40))
    assert sum(r.get("done", 0) for r in results) == 40
    with fresh_app.app_context():
        assert _statuses(ScheduledCommand, ScheduledCommand.kind, "counting") == ["done"] * 40
        db.session.remove()


def test_a_command_held_by_a_dead_worker_on_another_node_is_taken_over_once_its_lease_lapses(fresh_app, monkeypatch):
    runs = []
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "counting", lambda row, now: runs.append(row.id))
    now = utcnow()
    lease = fresh_app.config["OUTBOX_LEASE_SECONDS"]
    with fresh_app.app_context():
        command_id = schedule_command(db.session, "counting", now, now=now)
        # Claimed by a worker on another machine, which then died: no pid of it is visible here.
        db.session.execute(
            update(ScheduledCommand)
            .where(ScheduledCommand.id == command_id)
            .values(
                status="processing",
                attempts=1,
                claimed_by="node-b:4242:140000",
                claimed_until=now + timedelta(seconds=lease),
            )
        )
        db.session.commit()

        held = now + timedelta(seconds=lease - 1)
        assert wake_due_work(now=held)["woke"] == []
        assert drain_commands(now=held).get("done", 0) == 0 and runs == []

        lapsed = now + timedelta(seconds=lease + 0.5)
        assert wake_due_work(now=lapsed)["woke"] == ["commands"]
        assert drain_commands(now=lapsed)["done"] == 1
        assert runs == [command_id]
        row = db.session.get(ScheduledCommand, command_id)
        assert (row.status, row.attempts) == ("done", 2)
        db.session.remove()


def test_the_lease_a_dead_holder_keeps_is_short_enough_for_a_takeover_within_30_seconds(fresh_app):
    # Takeover = the lease, plus one poll (SCHEDULER_POLL_SECONDS), plus a drain starting.
    cfg = fresh_app.config
    assert cfg["OUTBOX_LEASE_SECONDS"] + cfg["SCHEDULER_POLL_SECONDS"] < 30


def test_a_failing_command_needs_no_job_of_its_own_to_retry(fresh_app, monkeypatch):
    calls = []

    def flaky(row, now):
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("the mail server hung up")

    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "flaky", flaky)
    now = utcnow()
    with fresh_app.app_context():
        command_id = schedule_command(db.session, "flaky", now, now=now)
        db.session.commit()
        assert drain_commands(now=now)["retry"] == 1
        assert queue.work_queue().count == 0 and queue.scheduler().count() == 0  # nothing armed in Redis
        row = db.session.get(ScheduledCommand, command_id)
        retry_at = as_utc(row.next_attempt_at)
        db.session.rollback()

        assert wake_due_work(now=retry_at - timedelta(seconds=1))["woke"] == []  # past the lookahead
        assert wake_due_work(now=retry_at)["woke"] == ["commands"]
        assert drain_commands(now=retry_at)["done"] == 1
        assert len(calls) == 2
        db.session.remove()


def test_several_schedulers_polling_at_once_wake_at_most_the_slots_and_run_each_deadline_once(fresh_app, redis_conn):
    pollers = 3
    with fresh_app.app_context():
        orders = _place_unpaid(10, utcnow() - timedelta(seconds=WINDOW + 5))
        redis_conn.flushdb()
    barrier = threading.Barrier(pollers)

    def poll():
        with fresh_app.app_context():
            barrier.wait()
            wake_due_work()
            db.session.remove()

    threads = [threading.Thread(target=poll) for _ in range(pollers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    with fresh_app.app_context():
        assert 1 <= queue.work_queue().count <= queue.DRAIN_SLOTS
        queue.run_worker(burst=True)
        db.session.expire_all()
        cancelled = db.session.execute(
            select(func.count()).where(Order.id.in_(orders), Order.status == "Cancelled")
        ).scalar_one()
        assert cancelled == 10
        done = (
            db.session.execute(select(ScheduledCommand.attempts).where(ScheduledCommand.kind == "expire_unpaid_order"))
            .scalars()
            .all()
        )
        assert done == [1] * 10
        db.session.remove()


def test_a_drain_runs_the_deadlines_due_before_older_emails(fresh_app, monkeypatch):
    """Under a backlog, the work that gives stock back is claimed first (outbox.claims.CLAIMED_FIRST):
    deadlines that fell due after a pile of emails still run in the first batch."""
    ran, lock = [], threading.Lock()

    def note(kind):
        def command(row, now):
            with lock:
                ran.append(kind)

        return command

    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "send_email", note("email"))
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "expire_unpaid_order", note("deadline"))
    now = utcnow()
    with fresh_app.app_context():
        for n in range(30):  # the emails fell due first, a minute ago
            schedule_command(db.session, "send_email", now - timedelta(seconds=60), payload={"n": n}, now=now)
        for n in range(5):
            schedule_command(db.session, "expire_unpaid_order", now, payload={"n": n}, now=now)
        db.session.commit()
        db.session.remove()
        drain_commands(now=now, batch_size=5)
    assert ran[:5] == ["deadline"] * 5  # the first batch: the deadlines, not the oldest emails
    assert ran.count("email") == 30  # and nothing is left behind


def test_a_drain_runs_the_held_money_work_due_before_older_emails(fresh_app, monkeypatch):
    """A ship's capture, a cancel's void and a hold's own deadline are money work: claimed first
    too (outbox.claims.CLAIMED_FIRST), so a backlog of emails never makes a hold lapse unseen."""
    ran, lock = [], threading.Lock()
    money = (CommandKind.CAPTURE_PAYMENT, CommandKind.VOID_PAYMENT, CommandKind.END_HOLD)

    def note(kind):
        def command(row, now):
            with lock:
                ran.append(kind)

        return command

    for kind in (CommandKind.SEND_EMAIL, *money):
        monkeypatch.setitem(shop.scheduling.commands.COMMANDS, kind, note(kind))
    now = utcnow()
    with fresh_app.app_context():
        for n in range(30):  # the emails fell due first, a minute ago
            schedule_command(db.session, CommandKind.SEND_EMAIL, now - timedelta(seconds=60), payload={"n": n}, now=now)
        for kind in money:
            schedule_command(db.session, kind, now, payload={}, now=now)
        db.session.commit()
        db.session.remove()
        drain_commands(now=now, batch_size=3)
    assert sorted(ran[:3]) == sorted(money)  # the first batch: the money work, not the oldest emails
    assert ran.count(CommandKind.SEND_EMAIL) == 30


def test_a_drain_wakes_redis_once_per_batch_not_once_per_deadline(fresh_app, monkeypatch):
    """A batch of expiries makes a restore (and an email) due per order; the drain tells Redis
    once after the batch, with every row the batch's commits made due."""
    with fresh_app.app_context():
        orders = _place_unpaid(12, utcnow() - timedelta(seconds=WINDOW + 5))
        announced = []
        monkeypatch.setattr(
            queue, "announce", lambda deliveries, commands, now=None: announced.append(list(deliveries))
        )
        drain_commands(batch_size=20)
        db.session.expire_all()
        cancelled = select(func.count()).where(Order.id.in_(orders), Order.status == "Cancelled")
        assert db.session.execute(cancelled).scalar_one() == 12
        db.session.remove()
    assert len(announced) == 1, announced
    assert len(announced[0]) == 12 * 2  # each order's restore and its cancellation email


def test_a_drain_with_nothing_due_runs_the_deadline_about_to_fall_due_instead_of_leaving_it_to_the_next_poll(
    fresh_app, monkeypatch
):
    ran = []
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "counting", lambda row, now: ran.append(row.id))
    with fresh_app.app_context():
        soon = utcnow() + timedelta(seconds=0.3)
        later = utcnow() + timedelta(seconds=30)  # past the lookahead: the poll's, not this drain's
        first = schedule_command(db.session, "counting", soon, now=utcnow())
        schedule_command(db.session, "counting", later, now=utcnow())
        db.session.commit()
        db.session.remove()
        result = drain_commands()
    assert ran == [first] and result["done"] == 1


def test_a_command_drain_out_of_budget_queues_its_successor_ahead_of_waiting_delivery_drains(fresh_app, redis_conn):
    """With a second worker listening, the deadlines still due do not wait out a delivery drain's
    budget behind it: the successor goes to the front, even with both command slots taken by
    drains the poll woke (queued behind the delivery drains). A lone worker takes turns."""
    from rq import Worker

    with fresh_app.app_context():
        queue.wake(queue.Drain.DELIVERIES)
        queue.wake(queue.Drain.DELIVERIES)
        queue.wake(queue.Drain.COMMANDS)
        queue.wake(queue.Drain.COMMANDS)  # both command slots taken
        behind = [j.func_name for j in queue.work_queue().jobs]
        assert behind[0] == queue.DRAIN_JOB

        alone = Worker([queue.work_queue()], connection=queue.redis_conn(), name="w1")
        alone.register_birth()
        assert queue.request_drain(kind=queue.Drain.COMMANDS, continuing=True) is False  # takes turns
        assert queue.work_queue().jobs[0].func_name == queue.DRAIN_JOB

        second = Worker([queue.work_queue()], connection=queue.redis_conn(), name="w2")
        second.register_birth()
        try:
            assert queue.request_drain(kind=queue.Drain.COMMANDS, continuing=True) is True
            assert queue.work_queue().jobs[0].func_name == queue.COMMAND_DRAIN_JOB
        finally:
            alone.register_death()
            second.register_death()


def test_a_command_drain_gives_the_front_up_once_a_restore_has_waited_past_its_patience(fresh_app, monkeypatch):
    """Priority with aging: deadlines first, but a restore due for longer than
    RESTORE_PATIENCE_SECONDS makes the next command drain queue behind the delivery drains."""
    import shop.jobs

    asked = []
    monkeypatch.setattr(
        queue, "request_drain", lambda kind=None, continuing=False, force=False: asked.append(continuing)
    )
    with fresh_app.app_context():
        _place_unpaid(3, utcnow() - timedelta(seconds=WINDOW + 5))  # three deadlines due
        monkeypatch.setattr(shop.outbox.dispatch, "drain_threads", lambda: 1)
        monkeypatch.setattr(shop.outbox.dispatch, "drain_commands_concurrently", lambda threads, **kw: {"more": True})
        shop.jobs.drain_commands()  # no restore waits: at the front
        order = place_order_for({seed_catalog_rows()["NB-A5-DOT"]: 1}).order_id
        from shop.orders.cancel import cancel_order

        assert cancel_order(order, None).status == "cancelled"  # its restore is due now
        db.session.remove()
        shop.jobs.drain_commands()  # the restore has not waited long yet
        later = utcnow() + timedelta(seconds=shop.jobs.RESTORE_PATIENCE_SECONDS + 1)
        monkeypatch.setattr(shop.outbox.dispatch, "utcnow", lambda: later)
        shop.jobs.drain_commands()  # now it has: behind the delivery drains
    assert asked == [True, True, False]


def test_while_deadlines_are_due_a_delivery_drain_gives_stock_back_and_holds_the_emails(fresh_app):
    """Stock first, words after: with a deadline due, the cancellations' restores run and their
    emails wait; once no deadline is due, the emails go."""
    from shop.models import OutboxDelivery
    from shop.orders.cancel import cancel_order
    from shop.outbox.dispatch import drain_deliveries

    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        cancelled = [place_order_for({a5: 1}).order_id for _ in range(3)]
        for order_id in cancelled:
            assert cancel_order(order_id, None).status == "cancelled"
        db.session.remove()
        _place_unpaid(1, utcnow() - timedelta(seconds=WINDOW + 5))  # a deadline due, not yet run

        drain_deliveries()
        assert sorted(_statuses(OutboxDelivery, OutboxDelivery.handler, "restore_inventory")) == ["done"] * 3
        assert _statuses(OutboxDelivery, OutboxDelivery.handler, "send_cancellation_email") == ["pending"] * 3

        drain_commands()  # the deadline runs: its own restore and email are written
        drain_deliveries()
        assert set(_statuses(OutboxDelivery, OutboxDelivery.handler, "send_cancellation_email")) == {"done"}
        db.session.remove()


def test_the_poll_wakes_a_command_drain_for_a_deadline_falling_due_within_the_lookahead(fresh_app, redis_conn):
    """The first deadline of a burst is not left to the next poll, up to a second after its
    instant: the poll before it wakes a drain, which waits for it (runner.COMMAND_LOOKAHEAD_SECONDS)."""
    with fresh_app.app_context():
        now = utcnow()
        schedule_command(db.session, "expire_unpaid_order", now + timedelta(seconds=0.3), payload={}, now=now)
        db.session.commit()
        db.session.remove()
        redis_conn.flushdb()
        assert wake_due_work(now)["woke"] == ["commands"]
        redis_conn.flushdb()
        assert wake_due_work(now - timedelta(seconds=5))["woke"] == []  # 5.3 s ahead: a later poll's
