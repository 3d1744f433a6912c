"""The outbox machinery: one delivery per (event, handler), claimed with a lease, retried alone
with exponential backoff, dead-lettered after the configured attempts, retried by an operator
with a fresh budget, and re-announced from the database when Redis forgets. Plus the follow-up
handlers (payment failed, paid) that turn their work into durable scheduled commands."""

from __future__ import annotations

import email
import logging
import os
import threading
from datetime import timedelta

import pytest
from sqlalchemy import select, update

import shop.saga
from compensation_support import cancel, on_hand, order, restore_delivery
from factories import place_order_for, seed_catalog_rows, transitioned
from shop import queue
from shop.domain.deadlines import as_utc, retry_delay_seconds, utcnow
from shop.domain.events import OrderPaid
from shop.domain.order import Transition as T
from shop.extensions import db
from shop.models import InventoryItem, Order, OutboxDelivery, OutboxEvent, ScheduledCommand
from shop.outbox import requeue, runner
from shop.outbox.dispatch import run_command, run_delivery
from shop.outbox.relay import relay_once
from shop.outbox.subscriptions import SUBSCRIPTIONS
from shop.saga.notifications import send_order_confirmation

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgres")


class Followups:
    """Two handlers on one event: one fails while `failing` is set, one only counts its runs."""

    def __init__(self):
        self.failing = True
        self.flaky_runs = 0
        self.counting_runs = 0

    def flaky(self, event, now):
        self.flaky_runs += 1
        if self.failing:
            raise RuntimeError(f"mail relay refused order {event.order_id}")

    def counting(self, event, now):
        self.counting_runs += 1


@pytest.fixture
def followups(monkeypatch):
    """Subscribe both to OrderPlaced (which has no handlers of its own): registration, not a mock."""
    handlers = Followups()
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", ["flaky_followup", "counting_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "flaky_followup", handlers.flaky)
    monkeypatch.setitem(shop.saga.HANDLERS, "counting_followup", handlers.counting)
    return handlers


def _delivery(order_id: int, handler: str) -> OutboxDelivery:
    db.session.expire_all()
    row = db.session.execute(
        select(OutboxDelivery).where(OutboxDelivery.order_id == order_id, OutboxDelivery.handler == handler)
    ).scalar_one()
    return row


def test_each_handler_of_an_event_gets_its_own_delivery(make_fresh_app, followups):
    app = make_fresh_app()
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 1}).order_id
        rows = db.session.execute(
            select(OutboxDelivery.handler, OutboxDelivery.status, OutboxEvent.name)
            .join(OutboxEvent)
            .where(OutboxDelivery.order_id == order_id)
        ).all()
        assert sorted(rows) == [
            ("counting_followup", "pending", "OrderPlaced"),
            ("flaky_followup", "pending", "OrderPlaced"),
        ]
        db.session.remove()


def test_an_always_failing_handler_is_dead_lettered_with_backoff_and_its_sibling_runs_once(
    make_fresh_app, followups, caplog
):
    base = 4.0
    app = make_fresh_app(OUTBOX_MAX_ATTEMPTS=5, OUTBOX_RETRY_BASE_SECONDS=base, OUTBOX_RETRY_CAP_SECONDS=300.0)
    # A delivery's backoff is honoured exactly (only scheduled commands may be claimed a little
    # early, for rq-scheduler's sake): half a second before it is too early.
    too_early = timedelta(seconds=0.5)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        t0 = utcnow()
        order_id = place_order_for({a5: 1}, now=t0).order_id
        flaky, counting = _delivery(order_id, "flaky_followup").id, _delivery(order_id, "counting_followup").id

        assert run_delivery(counting, now=t0) == "done"
        now, delays = t0, []
        with caplog.at_level(logging.WARNING, logger="shop.outbox"):
            for attempt in range(1, 6):
                if attempt > 1:  # a worker that turns up before the backoff has passed is refused
                    assert run_delivery(flaky, now=now - too_early) == "skipped"
                outcome = run_delivery(flaky, now=now)
                row = _delivery(order_id, "flaky_followup")
                assert row.attempts == attempt
                if attempt < 5:
                    assert (outcome, row.status) == ("retry", "pending")
                    delays.append((as_utc(row.next_attempt_at) - now).total_seconds())
                    now = as_utc(row.next_attempt_at)
                else:
                    assert (outcome, row.status) == ("dead", "dead")

        # Exponential with jitter: attempt n waits in [base * 2^(n-1) / 2, base * 2^(n-1)).
        assert all(base * 2 ** (n - 1) / 2 <= d < base * 2 ** (n - 1) + 0.01 for n, d in enumerate(delays, start=1)), (
            delays
        )
        assert delays == sorted(delays) and len(set(delays)) == 4
        assert "RuntimeError: mail relay refused order" in row.last_error
        assert "Traceback" in row.last_traceback and row.claimed_until is None
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1
        assert "dead letter" in errors[0].getMessage() and "OrderPlaced" in errors[0].getMessage()
        assert f"order {order_id}" in errors[0].getMessage()

        # Dead stays dead: neither a late job nor the relay brings it back.
        later = now + timedelta(days=1)
        assert run_delivery(flaky, now=later) == "skipped"
        assert relay_once(now=later)["deliveries"] == 0
        assert (followups.flaky_runs, followups.counting_runs) == (5, 1)
        assert _delivery(order_id, "counting_followup").status == "done"
        db.session.remove()


def test_the_outbox_runs_the_handlers_the_app_registered_and_never_dead_letters_for_a_missing_registry(
    make_fresh_app, followups
):
    """The outbox imports no use case: create_app hands it the handlers by name. A process whose
    app registered none (a bug there, not in the row) leaves the row to be retried, not dead."""
    app = make_fresh_app(OUTBOX_MAX_ATTEMPTS=5)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        t0 = utcnow()
        order_id = place_order_for({a5: 1}, now=t0).order_id
        counting = _delivery(order_id, "counting_followup").id
        handlers, commands = app.extensions["shop.outbox.work"]
        assert handlers is shop.saga.HANDLERS and "restore_inventory" in handlers and "refund_payment" in commands
        del app.extensions["shop.outbox.work"]
        try:
            assert run_delivery(counting, now=t0) == "retry"
            row = _delivery(order_id, "counting_followup")
            assert row.status == "pending" and "no handlers or commands registered" in row.last_error
        finally:
            app.extensions["shop.outbox.work"] = (handlers, commands)
        assert run_delivery(counting, now=as_utc(row.next_attempt_at)) == "done"
        assert followups.counting_runs == 1
        db.session.remove()


def test_a_retried_dead_letter_runs_again_with_a_fresh_budget_and_can_succeed(make_fresh_app, followups):
    app = make_fresh_app(OUTBOX_MAX_ATTEMPTS=2)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        t0 = utcnow()
        order_id = place_order_for({a5: 1}, now=t0).order_id
        flaky = _delivery(order_id, "flaky_followup").id
        assert run_delivery(flaky, now=t0) == "retry"
        assert run_delivery(flaky, now=t0 + timedelta(seconds=5)) == "dead"
        # Only a dead letter can be retried; a pending row is not one.
        assert requeue.retry_dead(OutboxDelivery, _delivery(order_id, "counting_followup").id) is False

        t1 = t0 + timedelta(minutes=10)
        assert requeue.retry_dead(OutboxDelivery, flaky, now=t1) is True
        row = _delivery(order_id, "flaky_followup")
        assert (row.status, row.attempts, row.max_attempts) == ("pending", 0, 2)
        # The fresh budget: one more failure is a retry, not an instant dead letter.
        assert run_delivery(flaky, now=t1) == "retry"
        followups.failing = False
        assert run_delivery(flaky, now=t1 + timedelta(seconds=5)) == "done"
        row = _delivery(order_id, "flaky_followup")
        assert (row.status, row.attempts, row.last_error) == ("done", 2, None)
        assert followups.flaky_runs == 4
        db.session.remove()


def test_two_workers_never_hold_one_delivery_at_once(fresh_app):
    """The claim is a lease: of many concurrent claims exactly one wins, nobody else can claim
    while the lease holds, and exactly one can take over once it lapses."""
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 1}).order_id
        cancel(order_id)
        delivery_id = restore_delivery(order_id).id
        db.session.remove()
    now = utcnow()
    barrier = threading.Barrier(20)
    wins, lock = [], threading.Lock()

    def claim(worker):
        with fresh_app.app_context():
            try:
                barrier.wait()
                won = runner.claim(OutboxDelivery, delivery_id, now, worker)
            finally:
                db.session.remove()
            with lock:
                wins.append((won, worker))

    threads = [threading.Thread(target=claim, args=(f"worker-{i}",)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [w for won, w in wins if won]
    assert len(wins) == 20 and len(winners) == 1

    lease = fresh_app.config["OUTBOX_LEASE_SECONDS"]
    with fresh_app.app_context():
        row = restore_delivery(order_id)
        assert (row.status, row.attempts, row.claimed_by) == ("processing", 1, winners[0])
        assert not runner.claim(OutboxDelivery, delivery_id, now + timedelta(seconds=lease - 1), "late")
        assert runner.claim(OutboxDelivery, delivery_id, now + timedelta(seconds=lease + 1), "rescuer")
        assert not runner.claim(OutboxDelivery, delivery_id, now + timedelta(seconds=lease + 2), "another")
        row = restore_delivery(order_id)
        assert (row.claimed_by, row.attempts) == ("rescuer", 2)
        db.session.remove()


@pytest.mark.skipif(not ON_POSTGRES, reason="needs two open write transactions at once (PostgreSQL)")
def test_a_worker_that_lost_its_lease_commits_none_of_its_writes(make_fresh_app, monkeypatch):
    """A worker so slow that its lease lapsed and another worker took the row must not commit:
    its writes and "done" are one transaction guarded by its claim."""
    app = make_fresh_app()
    taken_over = []

    def slow_handler(event, now):
        db.session.execute(
            update(InventoryItem).where(InventoryItem.variant_id == a5).values(on_hand=InventoryItem.on_hand + 100)
        )

        def rescuer():
            with app.app_context():
                later = now + timedelta(seconds=app.config["OUTBOX_LEASE_SECONDS"] + 1)
                taken_over.append(runner.claim(OutboxDelivery, delivery_id, later, "rescuer"))
                db.session.remove()

        t = threading.Thread(target=rescuer)
        t.start()
        t.join(30)

    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", ["slow_handler"])
    monkeypatch.setitem(shop.saga.HANDLERS, "slow_handler", slow_handler)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 1}).order_id
        delivery_id = _delivery(order_id, "slow_handler").id
        before = on_hand(a5)
        assert run_delivery(delivery_id) == "skipped"
        assert taken_over == [True]
        assert on_hand(a5) == before
        row = _delivery(order_id, "slow_handler")
        assert (row.status, row.claimed_by) == ("processing", "rescuer")
        db.session.remove()


@pytest.mark.usefixtures("no_order_placed_email")
def test_every_delivery_completes_after_redis_loses_everything(make_fresh_app, fake_clock, redis_conn):
    """The relay's grace period is read on the shop's clock, which only this test moves: on a
    loaded machine the wall clock could pass it between the cancels and the first relay, and the
    "inside the grace period" step would see the rows already due (it did, in CI)."""
    fresh_app = make_fresh_app(CLOCK=fake_clock)
    with fresh_app.app_context():
        skus = seed_catalog_rows()
        a5, sand = skus["NB-A5-DOT"], skus["MUG-350-SND"]
        orders = [place_order_for({a5: 2, sand: 1}).order_id for _ in range(4)]
        assert (on_hand(a5), on_hand(sand)) == (32, 8)
        for order_id in orders:
            cancel(order_id)  # committed, and announced to Redis after the commit

        redis_conn.flushdb()  # Redis loses everything between the commit and the worker
        queue.run_worker(burst=True)
        assert [restore_delivery(o).status for o in orders] == ["pending"] * 4
        assert (on_hand(a5), on_hand(sand)) == (32, 8)

        # Inside the grace period the relay leaves the rows to the post-commit announcement...
        assert relay_once()["deliveries"] == 0
        # ...after it, the database tells Redis again, and a worker finishes the job.
        grace = timedelta(seconds=fresh_app.config["RELAY_GRACE_SECONDS"] + 1)
        later = utcnow() + grace
        fake_clock.advance(grace.total_seconds())
        handlers = len(SUBSCRIPTIONS["OrderCancelled"])  # the restore and the customer's email, per cancel
        assert relay_once(now=later)["deliveries"] == 4 * handlers
        queue.run_worker(burst=True)
        for _ in range(3):  # the relay is periodic: if someone else flushed this Redis db, the next run
            if all(restore_delivery(o).status == "done" for o in orders):
                break
            later += grace
            relay_once(now=later)
            queue.run_worker(burst=True)

        assert [restore_delivery(o).status for o in orders] == ["done"] * 4
        assert all(order(o).inventory_restored for o in orders)
        assert (on_hand(a5), on_hand(sand)) == (40, 12)
        db.session.remove()


def test_a_commit_that_fails_announces_nothing_and_keeps_nothing(fresh_app, monkeypatch):
    """The one commit path announces only after the commit: a cancel whose commit fails leaves the
    order as it was, writes no outbox rows, and tells Redis nothing (a worker would otherwise be
    sent for a delivery that does not exist)."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from shop.orders.cancel import cancel_order

    announced = []
    monkeypatch.setattr(queue, "announce", lambda *a, **k: announced.append(a))
    with fresh_app.app_context():
        skus = seed_catalog_rows()
        order_id = place_order_for({skus["NB-A5-DOT"]: 2}).order_id
        announced.clear()  # the checkout's own announcement
        version = db.session.get(Order, order_id).version

        def the_database_goes_away(session):
            raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))

        event.listen(Session, "before_commit", the_database_goes_away)
        try:
            with pytest.raises(OperationalError):
                cancel_order(order_id, version)
        finally:
            event.remove(Session, "before_commit", the_database_goes_away)

        assert announced == []
        assert order(order_id).status == "PendingPayment"
        assert (
            db.session.execute(
                select(OutboxDelivery).where(
                    OutboxDelivery.order_id == order_id, OutboxDelivery.handler == "restore_inventory"
                )
            ).first()
            is None
        )
        db.session.remove()


@pytest.mark.usefixtures("no_order_placed_email")
def test_an_announce_that_fails_loses_nothing_the_relay_announces_it(fresh_app, monkeypatch):
    """Redis down at the moment of the announcement: the cancel still stands (its rows are
    committed), and the relay announces the delivery later, so the stock comes back."""
    import redis

    real_announce = queue.announce

    def redis_is_down(*args, **kwargs):
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    with fresh_app.app_context():
        skus = seed_catalog_rows()
        a5 = skus["NB-A5-DOT"]
        order_id = place_order_for({a5: 2}).order_id
        assert on_hand(a5) == 38
        monkeypatch.setattr(queue, "announce", redis_is_down)
        cancel(order_id)  # asserts the outcome is "cancelled": the announce failure is not the cancel's

        assert order(order_id).status == "Cancelled" and restore_delivery(order_id).status == "pending"
        monkeypatch.setattr(queue, "announce", real_announce)
        queue.run_worker(burst=True)
        assert on_hand(a5) == 38  # nobody told a worker
        later = utcnow() + timedelta(seconds=fresh_app.config["RELAY_GRACE_SECONDS"] + 1)
        assert relay_once(now=later)["deliveries"] >= 1
        queue.run_worker(burst=True)
        assert restore_delivery(order_id).status == "done" and on_hand(a5) == 40
        db.session.remove()


# --- the follow-ups and the mailer ------------------------------------------------------------


@pytest.fixture
def mail_app(make_fresh_app, monkeypatch, tmp_path):
    """An app whose instance folder (where mail is written without SMTP) is this test's own."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    app = make_fresh_app()
    assert app.instance_path == str(tmp_path / "instance")
    return app


def _commands(order_id: int, kind: str) -> list[ScheduledCommand]:
    db.session.expire_all()
    return list(
        db.session.execute(
            select(ScheduledCommand)
            .where(ScheduledCommand.order_id == order_id, ScheduledCommand.kind == kind)
            .order_by(ScheduledCommand.id)
        ).scalars()
    )


def _read_mail(app, name: str):
    """The one message whose file outbox key ends with `name` (a command's id, or a template)."""
    folder = os.path.join(app.instance_path, "mail")
    [found] = [n for n in os.listdir(folder) if n.endswith(f"-{name}.eml")]
    with open(os.path.join(folder, found), "rb") as fh:
        return email.message_from_binary_file(fh)


def test_a_failed_payment_schedules_the_email_and_rearms_the_deadline_as_commands(mail_app):
    app = mail_app
    window = app.config["UNPAID_ORDER_EXPIRY_SECONDS"]
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 1}, email="bob@example.com").order_id
        # Through the order store, as the payment use cases save these transitions.
        reference = transitioned(
            order_id,
            (T.START_PAYMENT, lambda o: o.start_payment("cs_test_1")),
            (T.MARK_PAYMENT_FAILED, lambda o: o.mark_payment_failed("card_declined")),
        ).reference
        db.session.remove()

        delivery = _delivery(order_id, "payment_failed_followups")
        now = utcnow() + timedelta(seconds=1)
        assert run_delivery(delivery.id, now=now) == "done"
        assert _delivery(order_id, "payment_failed_followups").attempts == 1

        [mail] = _commands(order_id, "send_email")
        assert mail.payload["template"] == "payment_failed" and mail.status == "pending"
        assert as_utc(mail.next_attempt_at) == now
        deadlines = _commands(order_id, "expire_unpaid_order")
        assert len(deadlines) == 2  # the checkout's, and the fresh window from the failure
        assert as_utc(deadlines[-1].next_attempt_at) == now + timedelta(seconds=window)
        assert as_utc(deadlines[-1].next_attempt_at) > as_utc(deadlines[0].next_attempt_at)

        mail_id = mail.id
        assert run_command(mail_id, now=now) == "done"
        message = _read_mail(app, mail_id)
        assert message["To"] == "bob@example.com"
        assert "did not go through" in message["Subject"] and reference in message["Subject"]
        body = message.get_payload(decode=True).decode()
        assert f"/orders/{reference}?token=" in body
        db.session.remove()


def test_a_paid_orders_confirmation_is_sent_by_its_delivery_and_a_redelivery_replaces_it(mail_app):
    app = mail_app
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 2}, email="cy@example.com").order_id
        reference = transitioned(
            order_id,
            (T.START_PAYMENT, lambda o: o.start_payment("cs_test_2")),
            (T.MARK_PAID, lambda o: o.mark_paid("cs_test_2", o.total, o.currency)),
        ).reference
        db.session.remove()

        now = utcnow()
        delivery_id = _delivery(order_id, "send_order_confirmation").id
        assert run_delivery(delivery_id, now=now) == "done"
        assert _commands(order_id, "send_email") == []  # no second row of work for it
        message = _read_mail(app, "order_paid-event")
        assert message["To"] == "cy@example.com" and reference in message["Subject"]
        # The receipt: text and HTML (tests/payments/test_shipping_receipt_and_declines.py reads both).
        text = next(p for p in message.walk() if p.get_content_type() == "text/plain")
        assert "$28.00" in text.get_payload(decode=True).decode()
        # A duplicate job for the same delivery is refused by its claim; a redelivery (the
        # worker died after sending, before its commit) writes the same message again, under the
        # same key: one message, not two.
        assert run_delivery(delivery_id, now=now) == "skipped"
        send_order_confirmation(OrderPaid(order_id, "cs_test_2", 2800, "usd"), now)
        assert len(os.listdir(os.path.join(app.instance_path, "mail"))) == 1
        db.session.remove()


def test_a_cancellation_notice_that_the_mail_server_refuses_retries_only_its_own_delivery(make_fresh_app):
    """The stock comes back at once; the email's delivery waits for the mail server alone."""
    app = make_fresh_app(SMTP_URL="smtp://127.0.0.1:9", OUTBOX_MAX_ATTEMPTS=2)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 1}, email="bob@example.com").order_id
        cancel(order_id)  # the customer's cancel, through its use case
        now = utcnow()
        assert run_delivery(_delivery(order_id, "restore_inventory").id, now=now) == "done"
        mail_id = _delivery(order_id, "send_cancellation_email").id
        outcomes = [run_delivery(mail_id, now=now + timedelta(minutes=minute)) for minute in (0, 10)]
        assert outcomes == ["retry", "dead"]
        dead = _delivery(order_id, "send_cancellation_email")
        assert "mail server 127.0.0.1:9 (SMTP_URL)" in dead.last_error
        assert _delivery(order_id, "restore_inventory").status == "done"
        db.session.remove()


# --- the pure backoff arithmetic ------------------------------------------------------------


@pytest.mark.parametrize("attempts", [1, 2, 3, 5, 8, 12, 40])
@pytest.mark.parametrize("rng", [0.0, 0.5, 0.999999])
def test_retry_delay_is_exponential_jittered_and_capped(attempts, rng):
    delay = retry_delay_seconds(attempts, base=2.0, cap=300.0, rng=lambda: rng)
    full = min(300.0, 2.0 * 2 ** (attempts - 1))
    assert full / 2 <= delay < full
    assert delay <= 300.0


def test_retry_delay_grows_until_the_cap():
    lows = [retry_delay_seconds(n, 2.0, 300.0, rng=lambda: 0.0) for n in range(1, 12)]
    highs = [retry_delay_seconds(n, 2.0, 300.0, rng=lambda: 0.999) for n in range(1, 12)]
    assert lows[:8] == sorted(lows[:8]) and len(set(lows[:8])) == 8
    assert all(h < lows[i + 1] for i, h in enumerate(highs[:7]))  # no overlap: backoff really grows
    assert max(highs) < 300.0 and lows[-1] == 150.0


def test_an_unreachable_mail_server_is_retried_and_its_dead_letter_names_the_server(make_fresh_app):
    """The operator reading the dead letter learns which server refused and where it is set,
    not just 'Connection refused'."""
    app = make_fresh_app(SMTP_URL="smtp://127.0.0.1:9", OUTBOX_MAX_ATTEMPTS=2)
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 1}, email="bob@example.com").order_id
        db.session.remove()
        from shop.outbox import schedule_command

        now = utcnow()
        schedule_command(db.session, "send_email", now, order_id=order_id, payload={"template": "order_paid"}, now=now)
        db.session.commit()
        [mail] = _commands(order_id, "send_email")
        outcomes = [run_command(mail.id, now=now + timedelta(minutes=minute)) for minute in (0, 10)]
        assert outcomes == ["retry", "dead"]
        [mail] = _commands(order_id, "send_email")
        assert "mail server 127.0.0.1:9 (SMTP_URL)" in mail.last_error
        db.session.remove()
