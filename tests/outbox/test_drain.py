"""Deliveries run by drains: one RQ job claims due deliveries in batches and runs each through
the same code as a single delivery. What a drain must never do: run a delivery that is not due,
run one twice, take a row whose lease holds, outlive its lease, or leave committed work without
a drain to run it (a lost wake-up)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select, update

import shop.saga
from compensation_support import cancel, on_hand, order, restore_delivery
from factories import place_order_for, seed_catalog_rows
from shop import jobs, queue
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import CommandKind, OutboxDelivery, ScheduledCommand
from shop.outbox import runner
from shop.outbox.dispatch import drain_deliveries, drain_deliveries_concurrently, drain_threads, run_delivery
from shop.outbox.relay import relay_once
from shop.outbox.subscriptions import SUBSCRIPTIONS
from shop.outbox.writer import schedule_command


@pytest.fixture(autouse=True)
def _only_the_restore_listens_to_cancellations(monkeypatch):
    """These tests use cancelled orders' restores as the sample work; the customer's cancellation
    email (a second handler of OrderCancelled) and the order-placed email would double every count
    without adding a case."""
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["restore_inventory"])
    # Nor the order-placed email: one more delivery per order, the same mechanics.
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", [])


def _cancelled_orders(n: int, variant: int) -> list[int]:
    orders = [place_order_for({variant: 1}).order_id for _ in range(n)]
    for order_id in orders:
        cancel(order_id)
    return orders


def _statuses(order_ids) -> list[tuple[str, int]]:
    return [(restore_delivery(o).status, restore_delivery(o).attempts) for o in order_ids]


def test_a_drain_runs_every_due_delivery_once_in_batches_and_leaves_a_backed_off_one_alone(fresh_app):
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(5, a5)
        backed_off = orders.pop()
        later = utcnow() + timedelta(minutes=5)
        db.session.execute(
            update(OutboxDelivery)
            .where(OutboxDelivery.order_id == backed_off)
            .values(attempts=1, next_attempt_at=later)
        )
        db.session.commit()
        now = utcnow() + timedelta(seconds=1)

        result = drain_deliveries(now=now, batch_size=2)

        assert (result["done"], result["more"]) == (4, False)
        assert _statuses(orders) == [("done", 1)] * 4
        assert all(order(o).inventory_restored for o in orders)
        # Not due until `later`: untouched, not even an attempt spent.
        row = restore_delivery(backed_off)
        assert (row.status, row.attempts, row.claimed_by) == ("pending", 1, None)
        assert on_hand(a5) == 40 - 1
        # A drain one second before the backoff ends takes nothing; one at its end runs it.
        assert drain_deliveries(now=later - timedelta(seconds=1)) == {"more": False}
        assert drain_deliveries(now=later)["done"] == 1
        assert on_hand(a5) == 40
        db.session.remove()


def test_a_drain_takes_a_lapsed_lease_but_never_one_that_still_holds(fresh_app):
    lease = fresh_app.config["OUTBOX_LEASE_SECONDS"]
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(2, a5)
        due = as_utc(restore_delivery(orders[1]).next_attempt_at)
        assert runner.claim(OutboxDelivery, restore_delivery(orders[0]).id, due, "worker-that-died")
        assert runner.claim(
            OutboxDelivery, restore_delivery(orders[1]).id, due + timedelta(seconds=lease), "busy-worker"
        )
        now = due + timedelta(seconds=lease + 1)  # the first lease lapsed a second ago, the second holds

        assert drain_deliveries(now=now)["done"] == 1

        assert _statuses(orders) == [("done", 2), ("processing", 1)]
        assert restore_delivery(orders[1]).claimed_by == "busy-worker"
        assert on_hand(a5) == 39
        db.session.remove()


def test_a_failing_delivery_in_a_batch_is_retried_alone_and_its_batch_mates_complete(fresh_app, monkeypatch):
    runs = []

    def flaky(event, now):
        runs.append(event.order_id)
        raise RuntimeError("mail relay down")

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["restore_inventory", "flaky_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "flaky_followup", flaky)
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(3, a5)
        now = utcnow() + timedelta(seconds=1)

        result = drain_deliveries(now=now)

        assert (result["done"], result["retry"]) == (3, 3)
        assert sorted(runs) == sorted(orders)
        assert _statuses(orders) == [("done", 1)] * 3
        failed = (
            db.session.execute(select(OutboxDelivery).where(OutboxDelivery.handler == "flaky_followup")).scalars().all()
        )
        assert {(r.status, r.attempts) for r in failed} == {("pending", 1)}
        assert all(as_utc(r.next_attempt_at) > now and "mail relay down" in r.last_error for r in failed)
        assert on_hand(a5) == 40
        # Backed off: the very next drain does not run them again.
        assert drain_deliveries(now=now) == {"more": False}
        assert len(runs) == 3
        db.session.remove()


def test_two_concurrent_drains_never_run_one_delivery_twice(fresh_app, monkeypatch):
    runs, lock = [], threading.Lock()

    def counting(event, now):
        with lock:
            runs.append(event.order_id)

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["counting_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "counting_followup", counting)
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(30, a5)
        db.session.remove()
    now = utcnow() + timedelta(seconds=1)
    barrier = threading.Barrier(2)
    results = []

    def drain():
        with fresh_app.app_context():
            barrier.wait()
            results.append(drain_deliveries(now=now, batch_size=4))

    threads = [threading.Thread(target=drain) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(runs) == sorted(orders)
    assert sum(r.get("done", 0) for r in results) == 30
    with fresh_app.app_context():
        rows = db.session.execute(select(OutboxDelivery.status, OutboxDelivery.attempts)).all()
        assert set(rows) == {("done", 1)} and len(rows) == 30
        db.session.remove()


def test_a_drain_jobs_threads_split_one_backlog_and_restore_every_order_exactly_once(make_fresh_app, fake_clock):
    """The drain job runs several threads in one worker process (drain_threads): each claims its
    own batches, and orders sharing the same two inventory rows are restored by both threads at
    once without one unit too many or too few. On a clock set by hand, so that the drain's time
    budget cannot run out in a loaded machine's real seconds (it stopped after 6 of 24 once)."""
    fresh_app = make_fresh_app(CLOCK=fake_clock)
    with fresh_app.app_context():
        skus = seed_catalog_rows()
        a5, other = skus["NB-A5-DOT"], sorted(v for s, v in skus.items() if s != "NB-A5-DOT")[0]
        before = on_hand(a5), on_hand(other)
        orders = [place_order_for({a5: 1, other: 1}).order_id for _ in range(24)]
        for order_id in orders:
            cancel(order_id)
        db.session.remove()

        result = drain_deliveries_concurrently(3, batch_size=2, now=utcnow() + timedelta(seconds=1))

        assert result == {"done": 24, "more": False}
        assert _statuses(orders) == [("done", 1)] * 24
        assert all(order(o).inventory_restored for o in orders)
        assert (on_hand(a5), on_hand(other)) == before
        # PostgreSQL overlaps the threads' waits; SQLite serialises writers, so one thread.
        assert drain_threads() == (1 if db.engine.dialect.name == "sqlite" else 3)
        db.session.remove()


def test_a_drain_gives_back_what_it_cannot_run_within_half_its_lease(make_fresh_app, monkeypatch, fake_clock):
    app = make_fresh_app(OUTBOX_LEASE_SECONDS=1, CLOCK=fake_clock)
    runs = []

    def slow(event, now):
        runs.append(event.order_id)
        fake_clock.advance(0.6)  # the handler's slow work, on the clock the drain reads

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["slow_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "slow_followup", slow)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(3, a5)
        rows = lambda: db.session.execute(
            select(
                OutboxDelivery.order_id,
                OutboxDelivery.status,  # noqa: E731
                OutboxDelivery.attempts,
                OutboxDelivery.claimed_by,
                OutboxDelivery.updated_at,
            ).order_by(OutboxDelivery.order_id)
        ).all()
        now = utcnow() + timedelta(seconds=1)

        result = drain_deliveries(now=now)

        assert (result["done"], result["released"], result["more"]) == (1, 2, True)
        assert runs == orders[:1]
        first, *rest = rows()
        assert first[1:3] == ("done", 1)
        # Back to pending with the attempt unspent, for the next drain, at the drain's time.
        assert [(*r[1:4], as_utc(r[4])) for r in rest] == [("pending", 0, None, now), ("pending", 0, None, now)]
        db.session.remove()


def test_a_drain_hands_the_worker_back_when_other_jobs_wait_and_asks_for_another(fresh_app):
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(5, a5)

        result = drain_deliveries(now=utcnow() + timedelta(seconds=1), batch_size=2, should_yield=lambda: True)

        assert (result["done"], result["more"]) == (2, True)
        assert sorted(s for s, _ in _statuses(orders)) == ["done", "done", "pending", "pending", "pending"]
        db.session.remove()


def test_announcing_enqueues_at_most_one_drain_per_slot_and_a_started_drain_frees_its_slot(fresh_app, redis_conn):
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        _cancelled_orders(6, a5)  # six announcements
        work = queue.work_queue()
        assert [j.func_name for j in work.jobs] == [queue.DRAIN_JOB] * queue.DRAIN_SLOTS

        queue.drain_started(0)  # a drain's first action
        _cancelled_orders(2, a5)
        assert [j.func_name for j in work.jobs] == [queue.DRAIN_JOB] * (queue.DRAIN_SLOTS + 1)

        queue.run_worker(burst=True)
        assert on_hand(a5) == 40
        assert {s for s, _ in _statuses(db.session.execute(select(OutboxDelivery.order_id)).scalars().all())} == {
            "done"
        }
        db.session.remove()


def test_work_committed_while_the_only_drain_runs_wakes_another(fresh_app, monkeypatch):
    """The drain frees its slot FIRST. Were it freed at the end, the order cancelled by the
    handler below (committed and announced while the drain runs, after its batch was claimed)
    would find the one slot taken, and nothing would ever run its compensation."""
    monkeypatch.setattr(queue.drain, "DRAIN_SLOTS", 1)  # the drain slots live in shop.queue.drain
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        first, second = place_order_for({a5: 1}).order_id, place_order_for({a5: 2}).order_id
        db.session.remove()

    def cancel_the_second(event, now):
        if event.order_id != first:
            return

        def other_session():
            with fresh_app.app_context():
                cancel(second)  # commits, then announces

        t = threading.Thread(target=other_session)
        t.start()
        t.join(30)

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["restore_inventory", "cancel_the_second"])
    monkeypatch.setitem(shop.saga.HANDLERS, "cancel_the_second", cancel_the_second)
    with fresh_app.app_context():
        cancel(first)
        assert [j.func_name for j in queue.work_queue().jobs] == [queue.DRAIN_JOB]

        queue.run_worker(burst=True)

        assert order(second).status == "Cancelled"
        assert restore_delivery(second).status == "done"
        assert on_hand(a5) == 40
        db.session.remove()


def test_the_relay_wakes_a_drain_even_when_the_slots_belong_to_drains_redis_lost(fresh_app, redis_conn):
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(2, a5)
        # The drain jobs are gone but their slots are still marked taken.
        redis_conn.delete(queue.work_queue().key)
        assert queue.work_queue().count == 0
        assert queue.request_drain() is False

        later = utcnow() + timedelta(seconds=fresh_app.config["RELAY_GRACE_SECONDS"] + 1)
        assert relay_once(now=later)["deliveries"] == 2
        queue.run_worker(burst=True)

        assert _statuses(orders) == [("done", 1)] * 2
        assert on_hand(a5) == 40
        db.session.remove()


def test_the_drain_job_runs_everything_due_through_a_real_worker(fresh_app):
    """jobs.drain as RQ runs it: frees its slot, drains, asks for more when it stopped early."""
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(3, a5)
        result = jobs.drain(0)
        assert result["done"] == 3 and not result["more"]
        assert _statuses(orders) == [("done", 1)] * 3
        db.session.remove()


def test_a_drain_yields_to_other_jobs_but_not_to_another_drain_of_either_kind(fresh_app):
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        _cancelled_orders(2, a5)  # two drains wait
        assert queue.work_queue().count == 2
        assert queue.other_jobs_waiting() is False

        queue.wake(queue.Drain.COMMANDS)  # a command drain is a drain too: each has its budget
        assert queue.other_jobs_waiting() is False

        queue.work_queue().enqueue(queue.RELAY_JOB)  # anything else (a relay, an operator's retry)
        assert queue.other_jobs_waiting() is True
        db.session.remove()


def test_a_drain_goes_on_when_redis_cannot_say_whether_other_jobs_wait(make_fresh_app):
    """A drain asks Redis between batches whether to hand the worker back; Redis away (a Sentinel
    failover) is no answer, not a failed job: a job failing there ended the whole worker, which
    then had to be restarted by hand."""
    from shop.queue.drain import other_jobs_waiting

    app = make_fresh_app(REDIS_URL="redis://127.0.0.1:9/0")  # nothing listens there
    with app.app_context():
        assert other_jobs_waiting() is False


def test_while_a_deadline_is_due_a_drain_runs_the_restores_and_holds_the_other_deliveries_back(fresh_app, monkeypatch):
    """Deadlines give stock back: while one is due, delivery drains run only the restores (the
    kinds claimed first) and leave the rest for when no deadline waits."""
    runs = []
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["restore_inventory", "counting_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "counting_followup", lambda event, now: runs.append(event.order_id))
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        orders = _cancelled_orders(2, a5)
        now = utcnow() + timedelta(seconds=1)
        schedule_command(db.session, CommandKind.EXPIRE_UNPAID_ORDER, now, now=now)
        db.session.commit()

        assert drain_deliveries(now=now) == {"done": 2, "more": False}

        assert _statuses(orders) == [("done", 1)] * 2 and runs == []
        db.session.execute(update(ScheduledCommand).values(status="done"))  # the deadline has run
        db.session.commit()
        assert drain_deliveries(now=now) == {"done": 2, "more": False}
        assert sorted(runs) == sorted(orders)
        db.session.remove()


def test_a_delivery_drain_ends_with_a_short_batch_and_leaves_what_fell_due_meanwhile(
    make_fresh_app, monkeypatch, fake_clock
):
    """Deliveries have no lookahead: a batch shorter than the batch size means nothing more was due
    when it was claimed, and the drain ends there (the poll wakes the next one)."""
    app = make_fresh_app(CLOCK=fake_clock)
    runs = []

    def slow(event, now):
        runs.append(event.order_id)
        fake_clock.advance(10)

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["slow_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "slow_followup", slow)
    with app.app_context():
        first, later = _cancelled_orders(2, seed_catalog_rows()["NB-A5-DOT"])
        db.session.execute(
            update(OutboxDelivery)
            .where(OutboxDelivery.order_id == later)
            .values(next_attempt_at=utcnow() + timedelta(seconds=5))
        )
        db.session.commit()

        assert drain_deliveries() == {"done": 1, "more": False}

        assert runs == [first]
        db.session.remove()


def test_a_drain_runs_on_until_past_half_its_lease(make_fresh_app, monkeypatch, fake_clock):
    """Exactly half of a 1 s lease gone (0.5 s): the next row still runs; at 1 s the rest goes back."""
    app = make_fresh_app(OUTBOX_LEASE_SECONDS=1, CLOCK=fake_clock)
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["slow_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "slow_followup", lambda event, now: fake_clock.advance(0.5))
    with app.app_context():
        _cancelled_orders(3, seed_catalog_rows()["NB-A5-DOT"])

        result = drain_deliveries(now=utcnow() + timedelta(seconds=1))

        assert (result["done"], result["released"], result["more"]) == (2, 1, True)
        db.session.remove()


def test_a_batch_runs_in_the_order_it_was_claimed_in_the_restores_before_older_emails(fresh_app, monkeypatch):
    """The batch is claimed restores first (claims.CLAIMED_FIRST), and runs in that order, not by
    id: a batch cut at half its lease gives back the emails, never a restore behind them."""
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", ["send_order_placed_email"])
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderCancelled", ["restore_inventory", "send_cancellation_email"])
    ran = []
    for name in ("send_order_placed_email", "restore_inventory", "send_cancellation_email"):
        monkeypatch.setitem(shop.saga.HANDLERS, name, lambda event, now, name=name: ran.append(name))
    with fresh_app.app_context():
        _cancelled_orders(1, seed_catalog_rows()["NB-A5-DOT"])  # placed (its email), then cancelled

        assert drain_deliveries(now=utcnow() + timedelta(seconds=1))["done"] == 3

        assert ran == ["restore_inventory", "send_order_placed_email", "send_cancellation_email"]
        db.session.remove()


def _delivery_reads(run) -> list[str]:
    """The SELECTs of deliveries or their events that `run()` made."""
    reads = []

    def count(conn, cursor, statement, *_):
        if statement.lstrip().upper().startswith("SELECT") and (
            "outbox_deliveries" in statement or "outbox_events" in statement
        ):
            reads.append(statement)

    sa_event.listen(db.engine, "before_cursor_execute", count)
    try:
        run()
    finally:
        sa_event.remove(db.engine, "before_cursor_execute", count)
    return reads


def test_a_drain_reads_its_batch_once_and_no_row_again_by_id(fresh_app, monkeypatch):
    """The claimed rows are read in one statement, with their events, and handed to each run:
    re-reading a row by id before running it (what a run by id does) would cost a statement per row;
    and a run by id reads its row with its event in one."""
    monkeypatch.setitem(shop.saga.HANDLERS, "restore_inventory", lambda event, now: None)
    with fresh_app.app_context():
        orders = _cancelled_orders(4, seed_catalog_rows()["NB-A5-DOT"])
        last = orders.pop()
        by_id = restore_delivery(last).id
        db.session.execute(
            update(OutboxDelivery)
            .where(OutboxDelivery.id == by_id)
            .values(next_attempt_at=utcnow() + timedelta(hours=1))
        )
        db.session.commit()
        later = utcnow() + timedelta(seconds=1)

        reads = _delivery_reads(lambda: drain_deliveries(now=later))
        assert len(reads) == 1 and _statuses(orders) == [("done", 1)] * 3, reads
        reads = _delivery_reads(lambda: run_delivery(by_id, now=later + timedelta(hours=1)))
        assert len(reads) == 1 and restore_delivery(last).status == "done", reads
        db.session.remove()


def test_a_drain_ends_once_its_time_budget_is_spent_to_the_instant(make_fresh_app, monkeypatch, fake_clock):
    """Batches of one, each taking half a second of a one-second budget: after the second batch the
    budget is spent exactly, and the drain hands the worker back, saying more may be due."""
    app = make_fresh_app(CLOCK=fake_clock)
    monkeypatch.setitem(shop.saga.HANDLERS, "restore_inventory", lambda event, now: fake_clock.advance(0.5))
    with app.app_context():
        _cancelled_orders(3, seed_catalog_rows()["NB-A5-DOT"])

        result = drain_deliveries(now=utcnow() + timedelta(seconds=1), batch_size=1, budget_seconds=1.0)

        assert (result["done"], result["more"]) == (2, True)
        db.session.remove()
