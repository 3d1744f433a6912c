"""The prune (docs/REFERENCE.md, `flask shop prune`): each kind of finished record goes after its
retention and not before; nothing live, dead or owed to a customer goes, however old; each batch
is its own transaction; the order's transitions stay and its console page says what went; the
CLI's dry run changes nothing; the periodic job is registered and the worker runs it.

Time moves by handing the prune a later `now` (its cutoffs are `now` minus the retention), so
every row is as its writer left it; the CLI, which reads the clock, gets rows made older."""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, func, insert, select, text, update

from factories import force_order, place_order_for, seed_catalog_rows, transitioned
from shop import create_app, jobs, queue
from shop.console.words import event_words
from shop.domain.deadlines import utcnow
from shop.domain.order import Transition as T
from shop.extensions import db
from shop.models import (
    OperatorAction,
    Order,
    OutboxDelivery,
    OutboxEvent,
    ProcessedStripeEvent,
    PrunedDetail,
    ReconciliationCycle,
    Refund,
    ScheduledCommand,
    WebhookReceipt,
)
from shop.outbox.dispatch import drain_deliveries
from shop.outbox.leases import acquire_lease
from shop.queue.connection import refusal
from shop.scheduling import retention
from support import base_config, log_in

pytestmark = pytest.mark.usefixtures("no_order_placed_email")


ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgres")
DAY = timedelta(days=1)


@pytest.fixture
def make_app(make_fresh_app, monkeypatch, tmp_path):
    """Apps on emptied stores whose mail (written to files) lands in this test's folder."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    return make_fresh_app


@pytest.fixture
def ctx(make_app):
    """An app context with the demo catalog, default retention (30 days, audit 400)."""
    app = make_app()
    with app.app_context():
        seed_catalog_rows()
        yield app
        db.session.remove()


# -- building what time leaves behind -----------------------------------------------------------


def paid_order(session_id: str = "cs_paid") -> int:
    """A paid order whose confirmation was delivered (done) and whose deadline went obsolete."""
    order_id = place_order_for().order_id
    transitioned(
        order_id,
        (T.START_PAYMENT, lambda o: o.start_payment(session_id)),
        (T.MARK_PAID, lambda o: o.mark_paid(session_id, o.total, o.currency)),
    )
    drain_deliveries()
    return order_id


def cancelled_order() -> int:
    """A cancelled order whose stock came back and whose email went: every delivery done."""
    order_id = place_order_for().order_id
    transitioned(order_id, (T.CANCEL, lambda o: o.cancel("cancelled by customer")))
    drain_deliveries()
    assert db.session.get(Order, order_id).inventory_restored
    db.session.rollback()
    return order_id


def failed_payment_order() -> int:
    """A live order (PaymentFailed) with its follow-ups delivered (done)."""
    order_id = place_order_for().order_id
    transitioned(
        order_id,
        (T.START_PAYMENT, lambda o: o.start_payment("cs_failed")),
        (T.MARK_PAYMENT_FAILED, lambda o: o.mark_payment_failed("card_declined")),
    )
    drain_deliveries()
    return order_id


def rows(model, order_id: int | None = None, **where) -> list:
    db.session.expire_all()
    query = select(model)
    if order_id is not None:
        query = query.where(model.order_id == order_id)
    for name, value in where.items():
        query = query.where(getattr(model, name) == value)
    found = list(db.session.execute(query).scalars())
    db.session.rollback()
    return found


def count(model) -> int:
    n = db.session.execute(select(func.count()).select_from(model)).scalar_one()
    db.session.rollback()
    return n


def receipt(order_id: int | None, at, event_id: str = "evt_1") -> None:
    db.session.execute(
        insert(WebhookReceipt).values(
            event_id=event_id,
            event_type="checkout.session.completed",
            outcome="accepted",
            reason="",
            order_id=order_id,
            http_status=200,
            received_at=at,
        )
    )
    db.session.commit()


def cycle(at, status: str) -> int:
    row = ReconciliationCycle(started_at=at, finished_at=None if status == "running" else at, cutoff=at, status=status)
    db.session.add(row)
    db.session.commit()
    return row.id


def action(order_id: int | None, at) -> None:
    db.session.add(
        OperatorAction(
            operator="op@example.com",
            action="reconcile",
            target="x",
            order_id=order_id,
            status=200,
            outcome="ok",
            created_at=at,
        )
    )
    db.session.commit()


def made_older(days: int) -> None:
    """Every finished row as if it had finished `days` ago (for the CLI, which reads the clock)."""
    then = utcnow() - days * DAY
    for model in (OutboxDelivery, ScheduledCommand):
        db.session.execute(
            update(model).where(model.completed_at.is_not(None)).values(completed_at=then, updated_at=then)
        )
    db.session.commit()


# -- each kind after its age, and not before ----------------------------------------------------


def test_finished_work_of_a_settled_order_goes_after_retention_days_and_its_transitions_stay(ctx):
    paid, cancelled = paid_order(), cancelled_order()
    events_before = count(OutboxEvent)
    deliveries = len(rows(OutboxDelivery, paid)) + len(rows(OutboxDelivery, cancelled))
    commands = len(rows(ScheduledCommand, paid)) + len(rows(ScheduledCommand, cancelled))
    assert deliveries == 3 and commands == 2  # confirmation; restore + email; two obsolete deadlines
    assert {c.status for c in rows(ScheduledCommand)} == {"obsolete"}

    early = retention.prune(utcnow() + 29 * DAY)
    assert early.counts["deliveries"] == 0 and early.counts["commands"] == 0
    assert count(OutboxDelivery) == 3 and count(ScheduledCommand) == 2

    late = retention.prune(utcnow() + 31 * DAY)
    assert late.counts["deliveries"] == 3 and late.counts["commands"] == 2
    assert count(OutboxDelivery) == 0 and count(ScheduledCommand) == 0
    assert count(OutboxEvent) == events_before  # the transitions: never pruned
    detail = db.session.get(PrunedDetail, paid)
    assert (detail.deliveries, detail.commands, detail.webhook_receipts) == (1, 1, 0)
    assert db.session.get(PrunedDetail, cancelled).deliveries == 2
    db.session.rollback()


def test_receipts_outlive_a_one_day_retention_for_seven_days_and_dedup_rows_for_thirty(make_app):
    app = make_app(RETENTION_DAYS=1)
    with app.app_context():
        seed_catalog_rows()
        order_id = paid_order()
        now = utcnow()
        receipt(order_id, now)
        receipt(None, now, "evt_unknown_order")
        db.session.add(ProcessedStripeEvent(event_id="evt_1", processed_at=now))
        db.session.commit()

        two_days = retention.prune(now + 2 * DAY)
        assert two_days.counts["deliveries"] == 1 and two_days.counts["commands"] == 1  # 1 day for work
        assert two_days.counts["webhook_receipts"] == 0 and count(WebhookReceipt) == 2  # Stripe still retries

        eight_days = retention.prune(now + 8 * DAY)
        assert eight_days.counts["webhook_receipts"] == 2 and count(WebhookReceipt) == 0
        assert db.session.get(PrunedDetail, order_id).webhook_receipts == 1  # the unknown order's is not counted
        assert count(ProcessedStripeEvent) == 1  # the provider still lists the event

        assert retention.prune(now + 31 * DAY).counts["provider_events"] == 1
        assert count(ProcessedStripeEvent) == 0
        db.session.remove()


def test_sweep_cycles_go_after_retention_but_never_a_running_one_nor_the_last_ok_one(ctx):
    now = utcnow()
    old_ok, last_ok = cycle(now - 50 * DAY, "ok"), cycle(now - 40 * DAY, "ok")
    old_failed, running = cycle(now - 35 * DAY, "failed"), cycle(now - 45 * DAY, "running")
    recent = cycle(now - DAY, "skipped")
    result = retention.prune(now)
    assert result.counts["sweep_cycles"] == 2
    kept = {c.id for c in rows(ReconciliationCycle)}
    assert kept == {last_ok, running, recent} and not kept & {old_ok, old_failed}


def test_operator_actions_are_kept_for_the_audit_retention_not_the_work_retention(ctx):
    order_id = paid_order()
    now = utcnow()
    action(order_id, now)
    action(None, now)
    assert retention.prune(now + 31 * DAY).counts["operator_actions"] == 0
    assert count(OperatorAction) == 2
    assert retention.prune(now + 399 * DAY).counts["operator_actions"] == 0
    assert retention.prune(now + 401 * DAY).counts["operator_actions"] == 2
    assert db.session.get(PrunedDetail, order_id).operator_actions == 1
    db.session.rollback()


def test_an_operators_other_records_are_kept_for_the_audit_retention_too(ctx):
    """Emails sent again, stock corrections and card acknowledgements: pruned with the audit trail
    that names them, not with the work; a resend of an order still owed something stays."""
    from shop.models import CardAcknowledgement, EmailResend, StockCorrection, Variant

    settled, live = paid_order(), place_order_for().order_id
    now = utcnow()
    variant = db.session.execute(select(Variant.id)).scalars().first()
    for n, order_id in enumerate((settled, live)):
        db.session.add(
            EmailResend(
                order_id=order_id, template="order_paid", operator="op@example.com", request_key=f"k{n}", created_at=now
            )
        )
    db.session.add(
        StockCorrection(
            variant_id=variant,
            operator="op@example.com",
            mode="adjust",
            old_on_hand=5,
            new_on_hand=6,
            reason="found one",
            request_key="s1",
            created_at=now,
        )
    )
    db.session.add(
        CardAcknowledgement(
            card="sweep", condition="x", operator="op@example.com", reason="known", until=now + DAY, created_at=now
        )
    )
    db.session.commit()
    first = retention.prune(now + 31 * DAY).counts
    assert (first["email_resends"], first["stock_corrections"], first["card_acknowledgements"]) == (0, 0, 0)
    later = retention.prune(now + 401 * DAY).counts
    assert (later["email_resends"], later["stock_corrections"], later["card_acknowledgements"]) == (1, 1, 1)
    assert [r.order_id for r in db.session.query(EmailResend)] == [live]  # its order still owes something
    db.session.rollback()


# -- nothing live, dead or owed ------------------------------------------------------------------


def test_nothing_live_dead_pending_or_owed_to_a_customer_is_pruned_however_old(ctx):
    live = failed_payment_order()  # PaymentFailed: live, its follow-up delivered
    assert {d.status for d in rows(OutboxDelivery, live)} == {"done"}
    receipt(live, utcnow(), "evt_live")
    refund_owed = cancelled_order()  # late money came, and its refund is still pending at the provider
    db.session.add(
        Refund(order_id=refund_owed, session_id="cs_late", amount=500, currency="usd", reason="late", status="pending")
    )
    refund_failed = cancelled_order()  # a refund that failed and no operator settled
    db.session.add(
        Refund(order_id=refund_failed, session_id="cs_gone", amount=500, currency="usd", reason="late", status="failed")
    )
    db.session.commit()
    watched = cancelled_order()
    force_order(watched, late_money_watch_since=utcnow())
    settled = cancelled_order()  # owes nothing: goes
    dead, pending = paid_order("cs_dead"), paid_order("cs_pending")
    # As a worker out of attempts, and one whose delivery is due again, left them (after the
    # drains above, which would have run a pending one).
    db.session.execute(
        update(OutboxDelivery)
        .where(OutboxDelivery.order_id == dead)
        .values(status="dead", completed_at=None, last_error="out of attempts")
    )
    db.session.execute(
        update(OutboxDelivery).where(OutboxDelivery.order_id == pending).values(status="pending", completed_at=None)
    )
    db.session.commit()

    result = retention.prune(utcnow() + 365 * DAY)

    for kept in (live, refund_owed, refund_failed, watched):
        assert rows(OutboxDelivery, kept), kept
        assert db.session.get(PrunedDetail, kept) is None
    assert rows(WebhookReceipt, live)
    assert rows(ScheduledCommand, live)
    assert [d.status for d in rows(OutboxDelivery, dead)] == ["dead"]
    assert [d.status for d in rows(OutboxDelivery, pending)] == ["pending"]
    assert rows(OutboxDelivery, settled) == []
    # dead's and pending's obsolete deadlines: finished work of a settled order
    assert result.counts["deliveries"] == 2 and result.counts["commands"] == 3
    assert {c.status for c in rows(ScheduledCommand, live)} == {"pending"}  # its new deadline and email


# -- small transactions -----------------------------------------------------------------------


def test_each_batch_commits_before_the_next_so_others_see_it_at_once(ctx):
    for n in range(5):
        paid_order(f"cs_batch_{n}")  # one done delivery each
    engine = create_engine(ctx.config["SQLALCHEMY_DATABASE_URI"])
    seen = []

    def look_from_another_connection():
        with engine.connect() as conn:
            seen.append(conn.execute(text("SELECT count(*) FROM outbox_deliveries")).scalar_one())

    try:
        result = retention.prune(utcnow() + 31 * DAY, batch_size=2, pause=look_from_another_connection)
    finally:
        engine.dispose()
    assert result.counts["deliveries"] == 5
    # After the first batch another connection already sees 3 left, after the second 1: each
    # batch committed on its own (a batch smaller than the size ends the kind, without a pause).
    assert seen[:2] == [3, 1]


def test_batches_go_on_from_where_the_last_one_ended_through_ties_and_past_held_rows(ctx):
    """Each batch starts its walk at the age the previous one reached (so it does not step over
    what the run already deleted): rows sharing one age across several batches all go, and a
    held row older or as old as them stays without stopping the walk."""
    settled, live = paid_order("cs_ties"), failed_payment_order()
    at = utcnow() - 40 * DAY
    receipt(live, at - DAY, event_id="evt_live_older")  # held: its order is live
    for n in range(7):
        receipt(settled, at, event_id=f"evt_tie_{n}")
    receipt(live, at, event_id="evt_live_tie")
    receipt(settled, at + DAY, event_id="evt_newer")

    result = retention.prune(utcnow() + 8 * DAY, batch_size=2, pause=lambda: None)

    assert result.counts["webhook_receipts"] == 8
    left = sorted(r.event_id for r in rows(WebhookReceipt))
    assert left == ["evt_live_older", "evt_live_tie"]


@pytest.mark.skipif(not ON_POSTGRES, reason="row locks and SKIP LOCKED are PostgreSQL's")
def test_a_row_another_transaction_holds_is_skipped_without_waiting_for_it(ctx):
    held, free = paid_order("cs_held"), paid_order("cs_free")
    [held_id] = [d.id for d in rows(OutboxDelivery, held)]
    engine = create_engine(ctx.config["SQLALCHEMY_DATABASE_URI"])
    locked, release = threading.Event(), threading.Event()

    def hold_the_row():  # an operator's retry, say, between its read and its commit
        with engine.begin() as conn:
            conn.execute(text("SELECT id FROM outbox_deliveries WHERE id = :id FOR UPDATE"), {"id": held_id})
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(10)
        result = retention.prune(utcnow() + 31 * DAY)
        # Done while the other transaction still held its row (it lets go only below): the prune
        # skipped the row instead of waiting for it.
        assert holder.is_alive(), "the prune waited for the row until its holder let go"
        assert result.counts["deliveries"] == 1
        assert rows(OutboxDelivery, free) == [] and [d.id for d in rows(OutboxDelivery, held)] == [held_id]
    finally:
        release.set()
        holder.join()
        engine.dispose()
    assert retention.prune(utcnow() + 31 * DAY).counts["deliveries"] == 1  # the next run takes it


def test_one_prune_at_a_time(ctx):
    paid_order()
    assert acquire_lease(retention.LEASE, "elsewhere:1:abc", utcnow(), 60)
    result = retention.prune(utcnow() + 31 * DAY)
    assert result.skipped and "another prune" in result.skipped
    assert count(OutboxDelivery) == 1


# -- the order's page ---------------------------------------------------------------------------


def test_the_console_page_of_a_pruned_order_still_shows_its_history_and_says_detail_was_pruned(make_app):
    app = make_app()
    client = app.test_client()
    log_in(app, client)
    with app.app_context():
        seed_catalog_rows()
        order_id = paid_order()
        reference = db.session.get(Order, order_id).reference
        receipt(order_id, utcnow())
        db.session.rollback()
    before = client.get(f"/console/orders/{reference}", headers={"Accept": "application/json"}).get_json()
    assert before["pruned"] is None and len(before["deliveries"]) == 1
    with app.app_context():
        retention.prune(utcnow() + 31 * DAY)
        db.session.remove()

    after = client.get(f"/console/orders/{reference}", headers={"Accept": "application/json"}).get_json()
    assert after["transitions"] == before["transitions"] and len(before["transitions"]) >= 2
    assert after["deliveries"] == [] and after["commands"] == [] and after["webhooks"] == []
    assert after["pruned"]["deliveries"] == 1 and after["pruned"]["commands"] == 1
    assert after["pruned"]["webhook_receipts"] == 1
    assert after["timeline"][-1]["kind"] == "pruned"
    assert [t for t in after["timeline"] if t["kind"] == "transition"] == [
        t for t in before["timeline"] if t["kind"] == "transition"
    ]

    page = client.get(f"/console/orders/{reference}", headers={"Accept": "text/html"}).get_data(as_text=True)
    assert "Older detail of this order was pruned by the retention rules" in page
    assert "1 event deliveries, 1 scheduled commands, 1 webhook receipts" in page
    assert "finished ones were pruned" in page
    for transition in before["transitions"]:  # in the page's words (shop/console/words.py)
        assert event_words(transition["event"]) in page


# -- the command ------------------------------------------------------------------------------


def test_the_dry_run_prints_the_counts_and_changes_nothing_then_the_real_run_removes_them(ctx):
    paid_order()
    cancelled_order()
    made_older(40)
    runner = ctx.test_cli_runner()

    dry = runner.invoke(args=["shop", "prune", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "dry run: nothing is removed" in dry.output
    assert "deliveries: would remove 3 event deliveries (done or discarded) older than" in dry.output
    assert "commands: would remove 2 scheduled commands (done or obsolete)" in dry.output
    assert count(OutboxDelivery) == 3 and count(ScheduledCommand) == 2

    real = runner.invoke(args=["shop", "prune"])
    assert real.exit_code == 0, real.output
    assert "deliveries: removed 3 event deliveries" in real.output
    assert "commands: removed 2 scheduled commands" in real.output
    assert "webhook_receipts: removed 0 webhook receipts" in real.output
    assert count(OutboxDelivery) == 0 and count(ScheduledCommand) == 0


def test_the_command_says_in_one_line_when_the_database_does_not_answer(database_url):
    app = create_app(base_config(database_url, DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:1/nowhere"))
    for args in (["shop", "prune"], ["shop", "prune", "--dry-run"]):
        result = app.test_cli_runner().invoke(args=args)
        assert result.exit_code == 1
        assert "backstop prune: the database did not answer (DATABASE_URL)" in result.output
        assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


# -- the periodic job --------------------------------------------------------------------------


def _periodic(prefix: str) -> dict[str, int]:
    return {
        job.id: job.meta.get("interval")
        for job in queue.scheduler().get_jobs()
        if job.id.startswith(f"{prefix}-periodic-")
    }


def test_the_scheduler_registers_the_prune_and_the_worker_runs_it(ctx):
    prefix = ctx.config["QUEUE_PREFIX"]
    paid_order()
    made_older(40)
    started = ctx.test_cli_runner().invoke(args=["shop", "scheduler", "--burst"])
    assert started.exit_code == 0, started.output
    assert f"{prefix}-periodic-prune (registered, every 3600s)" in started.output
    assert _periodic(prefix)[f"{prefix}-periodic-prune"] == 3600
    [job] = [j for j in queue.scheduler().get_jobs() if j.id == f"{prefix}-periodic-prune"]
    assert job.func_name == queue.PRUNE_JOB and queue.PRUNE_JOB in queue.ALLOWED_JOBS and refusal(job) is None

    queue.run_scheduler(burst=True)  # due now: moved to the control queue...
    queue.run_worker(burst=True)  # ...and run by a worker, which accepts it
    assert count(OutboxDelivery) == 0 and count(ScheduledCommand) == 0
    assert _periodic(prefix)[f"{prefix}-periodic-prune"] == 3600  # and it stays registered

    queue.register_periodic_jobs(5, 600)  # a release without the prune: it is removed
    assert f"{prefix}-periodic-prune" not in _periodic(prefix)


def test_the_prune_job_hands_its_worker_back_when_others_wait_and_queues_its_continuation(make_app, redis_conn):
    app = make_app(PRUNE_BATCH_SIZE=1)
    with app.app_context():
        seed_catalog_rows()
        for n in range(3):
            paid_order(f"cs_yield_{n}")
        made_older(40)
        control, _ = queue.queue_names()
        redis_conn.rpush(f"rq:queue:{control}", "someone-elses-job")  # another job waits

        summary = jobs.prune()
        assert summary["more"] is True and summary["removed"]["deliveries"] == 1
        assert count(OutboxDelivery) == 2
        queued = [j for j in queue.work_queue().jobs if j.func_name == queue.PRUNE_JOB]
        assert len(queued) == 1  # its continuation, behind the others
        assert not queue.request_prune()  # one continuation at a time

        redis_conn.delete(f"rq:queue:{control}")
        queue.work_queue().empty()
        summary = jobs.prune()  # the continuation, with nothing else waiting: to the end
        assert summary["more"] is False and count(OutboxDelivery) == 0
        db.session.remove()
