"""The reconciliation sweep: one leased cycle, expiry pass first, then the provider
pass, each order reloaded and re-checked in its own transaction.

Real database, Redis and the Stripe sandbox. Time is injected with `run_cycle(now=...)`: a cycle
run "window + a minute from now" sees every order placed during the test as stuck."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.exc import OperationalError

from factories import force_order, on_hand, place_order_for, seed_catalog_rows
from payment_helpers import awaiting_provider, session_of
from process_support import ROOT, flask_command, process_env, stop_between_writes
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import (
    Lease,
    Order,
    OutboxDelivery,
    OutboxEvent,
    PaymentProofRefusal,
    ReconciliationCycle,
    ScheduledCommand,
)
from shop.models.ops import CycleStatus
from shop.outbox.dispatch import run_delivery
from shop.payments.apply import reconcile_order
from shop.payments.start import start_payment
from shop.provider import gateway, guard
from shop.scheduling import lease as lease_module
from shop.scheduling import sweep
from shop.scheduling.passes.provider import RECHECK_CAP_INTERVALS
from shop.scheduling.sweep import run_cycle
from shop.store import order_store as store
from support import log_in, wait_until

WEBHOOK_SECRET = "whsec_test_secret"
ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgres")


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def build_app(make_fresh_app, sandbox):
    """An app wired to the sandbox, with extra config per test."""

    def build(**overrides):
        config = dict(
            STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60, STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET
        )
        config.update(overrides)
        app = make_fresh_app(**config)
        seed_catalog_rows(app)
        return app

    return build


def later(app, extra: int = 60):
    """An instant at which everything changed during this test is past the stuck age."""
    return utcnow() + timedelta(seconds=app.config["RECONCILIATION_STUCK_AGE_SECONDS"] + extra)


def order_state(order_id: int) -> str:
    status = db.session.execute(select(Order.status).where(Order.id == order_id)).scalar_one()
    db.session.rollback()
    return status


def backdate(order_id: int, when) -> None:
    force_order(order_id, updated_at=when)


def session_reads(sandbox, session_id: str | None = None) -> int:
    """How many times the app asked the sandbox for a checkout session."""
    rows = sandbox.get("/_sandbox/requests")["data"]
    return sum(
        r["count"]
        for r in rows
        if r["method"] == "GET"
        and r["path"].startswith("/v1/checkout/sessions/")
        and (session_id is None or r["path"] == f"/v1/checkout/sessions/{session_id}")
    )


def cancellations(order_id: int) -> int:
    count = db.session.query(OutboxEvent).filter_by(order_id=order_id, name="OrderCancelled").count()
    db.session.rollback()
    return count


def signed_post(app, body: bytes):
    """POST a webhook exactly as the provider signs it (`t=...,v1=HMAC(secret, "t.body")`)."""
    stamp = int(time.time())
    digest = hmac.new(WEBHOOK_SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return app.test_client().post(
        "/webhooks/stripe",
        data=body,
        content_type="application/json",
        headers={"Stripe-Signature": f"t={stamp},v1={digest}"},
    )


def paid_behind_our_back(sandbox) -> tuple[int, str, bytes]:
    """A PendingPayment order whose session was created and then paid, while our side never
    recorded the session (start_payment's commit was lost). Returns the paid event's body."""
    order_id = place_order_for().order_id
    order = db.session.get(Order, order_id)
    view = gateway.create_checkout_session(
        order_id=order.id,
        reference=order.reference,
        attempt=1,
        lines=list(order.lines),
        currency=order.currency,
        email=order.email,
        expires_at=utcnow() + timedelta(hours=1),
        success_url="http://127.0.0.1:5000/checkout/return",
        cancel_url="http://127.0.0.1:5000/",
    )
    db.session.rollback()
    sandbox.set_outcome(view.id, "paid")
    completed = sandbox.events("checkout.session.completed")
    assert len(completed) == 1
    return order_id, view.id, json.dumps(completed[0]["event"]).encode()


# -- the expiry pass -------------------------------------------------------------------------


def test_expiry_pass_cancels_a_stranded_order_whose_deadline_row_is_gone_and_its_stock_comes_back(build_app):
    app = build_app()
    with app.app_context():
        before = on_hand("MUG-350-SND")
        order_id = place_order_for({"MUG-350-SND": 3}).order_id
        assert on_hand("MUG-350-SND") == before - 3
        db.session.query(ScheduledCommand).filter_by(order_id=order_id).delete()
        db.session.commit()

        young = run_cycle()  # nothing is past the cutoff yet
        assert young.status == "ok" and young.expiry["cancelled"] == 0
        assert order_state(order_id) == "PendingPayment"

        result = run_cycle(now=later(app))
        assert result.status == "ok"
        assert result.expiry["cancelled"] == 1 and result.expiry["lost_race"] == 0
        assert order_state(order_id) == "Cancelled"
        assert on_hand("MUG-350-SND") == before - 3  # compensation has not run yet

        deliveries = [
            d.id for d in db.session.query(OutboxDelivery).filter_by(order_id=order_id, handler="restore_inventory")
        ]
        db.session.rollback()
        assert len(deliveries) == 1
        assert run_delivery(deliveries[0]) == "done"
        assert on_hand("MUG-350-SND") == before
        assert db.session.get(Order, order_id).inventory_restored is True


def test_an_order_the_provider_pass_moves_to_payment_failed_is_not_cancelled_in_the_same_cycle(build_app):
    # The session outlives the window (the provider's minimum is longer) and is expired early, by
    # hand at the provider, before its time: a failed attempt, not the end of the window.
    app = build_app(STRIPE_SESSION_MIN_SECONDS=3600)
    with app.app_context():
        order_id, sid = awaiting_provider()
        gateway.expire_session(sid)  # expired at the provider; the expired webhook never came

        result = run_cycle(now=later(app))

        assert result.provider["payment_failed"] == 1
        assert result.expiry["cancelled"] == 0
        assert order_state(order_id) == "PaymentFailed"  # its retry window starts now
        assert cancellations(order_id) == 0


# -- the provider pass -----------------------------------------------------------------------


def test_a_paid_session_whose_webhook_was_dropped_marks_the_order_paid(build_app, sandbox):
    app = build_app()
    with app.app_context():
        order_id, sid = awaiting_provider()
        sandbox.faults(drop_webhooks=1)
        sandbox.set_outcome(sid, "paid")
        assert order_state(order_id) == "PaymentInitiated"

        result = run_cycle(now=later(app))

        assert result.provider["paid"] == 1
        assert order_state(order_id) == "Paid"
        assert session_reads(sandbox, sid) == 1
        again = run_cycle(now=later(app))  # a paid order is no longer anyone's business here
        assert again.provider["paid"] == 0 and session_reads(sandbox, sid) == 1


def test_a_session_that_expired_at_the_end_of_the_window_cancels_the_order(build_app, sandbox):
    """The session lives until the order's pay-by time: it expiring then is the window ending,
    so the order is cancelled (its stock comes back), not given a second window."""
    app = build_app()
    with app.app_context():
        order_id, sid = awaiting_provider()
        sandbox.advance_clock(app.config["UNPAID_ORDER_EXPIRY_SECONDS"] + 120)  # past the session's expires_at

        result = run_cycle(now=later(app))

        assert result.provider["cancelled"] == 1 and result.provider["payment_failed"] == 0
        assert order_state(order_id) == "Cancelled"
        assert cancellations(order_id) == 1


def test_an_open_session_is_left_alone(build_app, sandbox):
    app = build_app()
    with app.app_context():
        order_id, sid = awaiting_provider()
        result = run_cycle(now=later(app))
        assert result.provider["open"] == 1
        assert order_state(order_id) == "PaymentInitiated"


def test_a_paid_session_that_fails_the_payment_proof_leaves_the_order_and_records_the_refusal(
    build_app, sandbox, caplog
):
    app = build_app()
    with app.app_context():
        order_id, sid = awaiting_provider()
        sandbox.set_outcome(sid, "paid")
        force_order(order_id, total=Order.total + 100)

        with caplog.at_level(logging.WARNING, logger="shop.payments"):
            result = run_cycle(now=later(app))

        assert result.provider["proof_refused"] == 1 and result.provider["paid"] == 0
        assert order_state(order_id) == "PaymentInitiated"
        refusal = db.session.query(PaymentProofRefusal).filter_by(order_id=order_id).one()
        assert refusal.source == "sweep" and refusal.session_id == sid
        assert any(r.levelno == logging.WARNING and "payment proof refused" in r.getMessage() for r in caplog.records)


def test_an_unreachable_provider_is_counted_and_the_orders_wait_for_the_next_cycle(build_app, sandbox):
    app = build_app()
    with app.app_context():
        orders = [awaiting_provider() for _ in range(4)]
        for _, sid in orders:
            sandbox.set_outcome(sid, "paid")
        sandbox.faults(api_unavailable=True)
        reads_before = session_reads(sandbox)

        down = run_cycle(now=later(app))

        assert down.status == "ok" and down.provider["unavailable"] == 4
        # after UNAVAILABLE_STREAK_LIMIT silent answers in a row it stops spending calls
        assert session_reads(sandbox) - reads_before == sweep.UNAVAILABLE_STREAK_LIMIT
        assert {order_state(o) for o, _ in orders} == {"PaymentInitiated"}

        sandbox.faults(api_unavailable=False)
        up = run_cycle(now=later(app))
        assert up.provider["paid"] == 4
        assert {order_state(o) for o, _ in orders} == {"Paid"}


def test_one_orders_failure_does_not_poison_the_batch(build_app, sandbox):
    app = build_app()
    with app.app_context():
        lost, _ = awaiting_provider()
        sandbox.reset()  # the provider forgot that session: asking about it is refused (404)
        paid, sid = awaiting_provider()
        sandbox.set_outcome(sid, "paid")
        backdate(lost, utcnow() - timedelta(seconds=5))  # the broken one comes first

        result = run_cycle(now=later(app))

        assert result.status == "ok"
        assert result.provider["errors"] == 1 and result.provider["paid"] == 1
        assert [e["order_id"] for e in result.errors] == [lost]
        assert order_state(lost) == "PaymentInitiated" and order_state(paid) == "Paid"
        recorded = db.session.get(ReconciliationCycle, result.cycle_id)
        assert recorded.errors[0]["order_id"] == lost and recorded.provider_counts["paid"] == 1


# -- races -----------------------------------------------------------------------------------


def _webhook_in_another_thread(app, body: bytes) -> dict:
    """Deliver the webhook from its own thread (own app context, own session and connection),
    and wait for it: from the sweep's point of view it lands at exactly this instant."""
    answer = {}

    def deliver():
        response = signed_post(app, body)
        answer["status"], answer["json"] = response.status_code, response.get_json()

    worker = threading.Thread(target=deliver)
    worker.start()
    worker.join(timeout=30)
    return answer


@pytest.mark.skipif(
    not ON_POSTGRES, reason="SQLite takes the write lock at BEGIN, so no writer can land between a load and its save"
)
def test_a_webhook_landing_between_the_sweeps_load_and_save_wins(build_app, sandbox, caplog):
    app = build_app(RECONCILIATION_ENABLED=False)
    with app.app_context():
        order_id, _, body = paid_behind_our_back(sandbox)
        answers = []

        def webhook_first(state):
            # the sweep's save of the cancel (the order store's guarded UPDATE), after its load
            if state.statement is store.TRANSITIONS["cancel"][0] and not answers:
                answers.append(_webhook_in_another_thread(app, body))

        event.listen(db.session, "do_orm_execute", webhook_first)
        try:
            with caplog.at_level(logging.INFO, logger="shop.sweep"):
                result = run_cycle(now=later(app))
        finally:
            event.remove(db.session, "do_orm_execute", webhook_first)

        assert answers and answers[0]["status"] == 200 and answers[0]["json"]["outcome"] == "paid"
        assert result.expiry["lost_race"] == 1 and result.expiry["cancelled"] == 0
        assert order_state(order_id) == "Paid"
        assert cancellations(order_id) == 0
        assert any(r.levelno == logging.INFO and "lost a race" in r.getMessage() for r in caplog.records)


def test_a_webhook_landing_between_the_sweeps_select_and_reload_wins(build_app, sandbox):
    app = build_app(RECONCILIATION_ENABLED=False)
    with app.app_context():
        order_id, _, body = paid_behind_our_back(sandbox)
        sweeper = threading.get_ident()
        answers = []

        def webhook_first(state):
            # the sweep's first load of a whole Order (the per-order reload, after the id query)
            if threading.get_ident() != sweeper or answers or not state.is_select:
                return
            if [d.get("type") for d in state.statement.column_descriptions] == [Order]:
                answers.append(_webhook_in_another_thread(app, body))

        event.listen(db.session, "do_orm_execute", webhook_first)
        try:
            result = run_cycle(now=later(app))
        finally:
            event.remove(db.session, "do_orm_execute", webhook_first)

        assert answers and answers[0]["json"]["outcome"] == "paid"
        assert result.expiry["changed"] == 1 and result.expiry["cancelled"] == 0
        assert order_state(order_id) == "Paid"
        assert cancellations(order_id) == 0


def test_two_cycles_started_at_once_make_one_provider_call_per_order(build_app, sandbox, monkeypatch):
    app = build_app()
    with app.app_context():
        orders = [awaiting_provider() for _ in range(3)]
        for _, sid in orders:
            sandbox.set_outcome(sid, "paid")
        when = later(app)
    # Both cycles have loaded an order and let go of the database before either asks the
    # provider, so without the lease both would ask about every order.
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "sweep.before_provider_call=sleep:0.3")
    start = threading.Barrier(2)
    results, failures = [], []

    def cycle():
        try:
            with app.app_context():
                start.wait(timeout=10)
                results.append(run_cycle(now=when))
                db.session.remove()
        except Exception as exc:  # pragma: no cover - surfaced by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=cycle) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert not failures
    assert sorted(r.status for r in results) == ["ok", "skipped"]
    assert [session_reads(sandbox, sid) for _, sid in orders] == [1, 1, 1]
    with app.app_context():
        assert {order_state(o) for o, _ in orders} == {"Paid"}
        recorded = sorted(c.status for c in db.session.query(ReconciliationCycle))
        assert recorded == ["ok", "skipped"]
        assert db.session.query(Lease).count() == 0  # released at the end


@pytest.mark.parametrize("why", ["heartbeat_frozen", "database_unreachable"])
def test_a_cycle_that_outlives_its_lease_stops_before_the_next_order(build_app, monkeypatch, why):
    """The heartbeat could not renew the lease (its thread stalled, as in a frozen process, or the
    database did not answer it): the lease runs out under the cycle, nobody has taken it yet,
    and the cycle still stops before its next order, because another may take it any moment."""
    # The lease is long enough for the cycle to reach its first order on a loaded machine (0.3 s
    # was not, under a loaded CI: the lease lapsed before the first order), and that order
    # outlasts it.
    app = build_app(RECONCILIATION_LEASE_SECONDS=1.5)
    with app.app_context():
        first, second = place_order_for().order_id, place_order_for().order_id
        backdate(first, utcnow() - timedelta(seconds=10))
        failpoints = "sweep.after_order=sleep:2"  # one order outlasts the lease
        if why == "heartbeat_frozen":
            failpoints += ",sweep.lease_heartbeat=sleep:6"
        else:

            def unreachable(*args, **kwargs):
                raise OperationalError("UPDATE leases", {}, Exception("connection refused"))

            monkeypatch.setattr(lease_module, "renew_lease_on", unreachable)
        monkeypatch.setenv("BACKSTOP_FAILPOINTS", failpoints)

        result = run_cycle(now=later(app))

        assert result.status == "failed" and result.reason == "lost the lease"
        assert result.expiry["cancelled"] == 1
        assert order_state(first) == "Cancelled" and order_state(second) == "PendingPayment"
        recorded = db.session.get(ReconciliationCycle, result.cycle_id)
        assert recorded.status == "failed" and "lease" in recorded.errors[-1]["error"]


def test_a_cycle_longer_than_several_leases_keeps_its_lease_by_its_heartbeat_and_no_other_starts(
    build_app, monkeypatch
):
    """Each order takes longer than the whole lease (a slow provider call would): without a
    renewal while the work runs, the lease would lapse under every order, the cycle would stop
    after its first, and the cycles tried meanwhile would take over. The heartbeat keeps it for
    the whole cycle, and every other cycle is skipped. The lease is the shortest the settings
    admit (docs/REFERENCE.md: 2 s, renewed every half second); at 1 s, below that, a loaded run's
    heartbeat once went a whole second unscheduled and the cycle rightly stopped."""
    lease = 2.0
    app = build_app(RECONCILIATION_LEASE_SECONDS=lease)
    with app.app_context():
        ids = [place_order_for().order_id for _ in range(3)]  # 4.5 leases of work
        for order_id in ids:
            backdate(order_id, utcnow() - timedelta(hours=1))
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", f"sweep.after_order=sleep:{lease * 1.5}")
    results, others, failures = [], [], []
    done = threading.Event()

    def long_cycle():
        try:
            with app.app_context():
                results.append(run_cycle())
                db.session.remove()
        except Exception as exc:  # pragma: no cover - surfaced by the assertion below
            failures.append(exc)
        finally:
            done.set()

    def contenders():
        try:
            with app.app_context():
                while not done.wait(lease / 4):
                    others.append(run_cycle())
                    db.session.remove()
        except Exception as exc:  # pragma: no cover
            failures.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=long_cycle), threading.Thread(target=contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert not failures
    [result] = results
    assert time.monotonic() - started > 4 * lease  # the cycle outlived its lease several times over
    assert result.status == "ok" and result.expiry["cancelled"] == len(ids), result.report_lines()
    # The contenders run one after another; only the last can have begun before the long cycle
    # ended and asked for the lease after it was released, and then it runs (with nothing left).
    *during, last = others
    assert len(during) >= 8 and {r.status for r in during} == {CycleStatus.SKIPPED}, [r.report_lines() for r in others]
    assert last.status in (CycleStatus.SKIPPED, CycleStatus.OK), last.report_lines()
    with app.app_context():
        assert [cancellations(o) for o in ids] == [1] * len(ids)
        assert db.session.query(Lease).count() == 0  # released at the end


def test_a_cycle_returns_only_once_its_heartbeat_has_ended_and_given_its_connection_back(build_app, monkeypatch):
    """A renewal under way when the cycle ends holds a connection of the app's pool until it lands
    (on SQLite it waits for the write lock of the cycle's last transaction). A cycle that returned
    before it left the connection out for whatever ran next: a loaded run's check of the pool
    after a test once found it there. Here the heartbeat's first beat (at 1 s) is held in a
    failpoint until 3 s, and the cycle's only order is done at 1.5 s: the cycle waits for the
    beat to end before it returns."""
    app = build_app(RECONCILIATION_LEASE_SECONDS=4.0)  # a beat a second; the lease outlasts the cycle
    with app.app_context():
        backdate(place_order_for().order_id, utcnow() - timedelta(hours=1))
        monkeypatch.setenv("BACKSTOP_FAILPOINTS", "sweep.after_order=sleep:1.5,sweep.lease_heartbeat=sleep:2")

        run_cycle()

        beating = [t.name for t in threading.enumerate() if t.name.startswith("lease-heartbeat-")]
        assert beating == []
        db.session.remove()
        assert db.engine.pool.checkedout() == 0


def test_a_cycle_whose_lease_was_taken_over_stops_at_the_heartbeat_s_refusal(build_app, monkeypatch):
    """Another holder has the lease (an operator's hand here; a takeover after a stall in life):
    the heartbeat's conditional renewal is refused, and the cycle stops before its next order
    although its own last renewal has not run out yet."""
    app = build_app(RECONCILIATION_LEASE_SECONDS=2)
    with app.app_context():
        ids = [place_order_for().order_id for _ in range(3)]
        for order_id in ids:
            backdate(order_id, utcnow() - timedelta(hours=1))
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "sweep.after_order=sleep:1.2")
    results = []

    def cycle():
        with app.app_context():
            results.append(run_cycle())
            db.session.remove()

    thread = threading.Thread(target=cycle)
    thread.start()
    try:
        with app.app_context():
            wait_until(
                lambda: sum(order_state(o) == "Cancelled" for o in ids),
                30,
                "the cycle to cancel an order",
                interval=0.02,
            )
            db.session.execute(update(Lease).values(holder="another-node:1:cafe0009"))
            db.session.commit()
    finally:
        thread.join(timeout=60)
    [result] = results
    assert result.status == "failed" and result.reason == "lost the lease", result.report_lines()
    assert result.expiry["cancelled"] == 1
    with app.app_context():
        assert sorted(order_state(o) for o in ids) == ["Cancelled", "PendingPayment", "PendingPayment"]
        # The cycle releases only its own lease: the one who took it keeps it.
        assert db.session.execute(select(Lease.holder)).scalar_one() == "another-node:1:cafe0009"


def test_a_lease_held_by_another_live_cycle_skips_the_cycle(build_app, sandbox):
    app = build_app()
    with app.app_context():
        order_id = place_order_for().order_id
        when = later(app)
        db.session.add(Lease(name=sweep.LEASE_NAME, holder="other-replica", expires_at=when + timedelta(seconds=60)))
        db.session.commit()

        skipped = run_cycle(now=when)
        assert skipped.status == "skipped" and "other-replica" in skipped.reason
        assert order_state(order_id) == "PendingPayment"

        taken_over = run_cycle(now=when + timedelta(seconds=61))  # its holder died: the lease lapsed
        assert taken_over.status == "ok" and taken_over.expiry["cancelled"] == 1


def test_a_lease_whose_holder_was_killed_on_this_machine_is_taken_over_at_once(build_app):
    """Found by the long chaos run: a worker SIGKILLed mid-cycle left the lease held for its
    whole 300 s, every cycle meanwhile was skipped, and late money for cancelled orders waited
    that long to be found. A holder that was a process on this machine and is gone no longer
    blocks; one that is alive, or on another machine, still does."""
    import socket
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()[:60]
    app = build_app()
    try:
        with app.app_context():
            order_id = place_order_for().order_id
            when = later(app)
            lease = Lease(
                name=sweep.LEASE_NAME, holder=f"{host}:{alive.pid}:cafe0001", expires_at=when + timedelta(seconds=300)
            )
            db.session.add(lease)
            db.session.commit()
            assert run_cycle(now=when).status == "skipped"  # alive on this machine: it holds
            db.session.execute(update(Lease).values(holder=f"elsewhere:{gone.pid}:cafe0002"))
            db.session.commit()
            assert run_cycle(now=when).status == "skipped"  # another machine: cannot be checked
            assert order_state(order_id) == "PendingPayment"

            db.session.execute(update(Lease).values(holder=f"{host}:{gone.pid}:cafe0003"))
            db.session.commit()
            taken_over = run_cycle(now=when)  # long before the lease would lapse
            assert taken_over.status == "ok" and taken_over.expiry["cancelled"] == 1
            assert order_state(order_id) == "Cancelled"

            # The operator reads it on the sweeps page: a process died in the middle of a cycle.
            # A note, not an error: this cycle settled what that one left, so the dashboard's
            # sweep card does not say an order could not be settled.
            assert taken_over.errors == [] and len(taken_over.notes) == 1
            client = app.test_client()
            log_in(app, client)
            page = client.get("/console/sweeps").get_data(as_text=True)
            assert f"took over the sweep lease of {host}:{gone.pid}:cafe0003" in page, page
            cycles = client.get("/console/sweeps", headers={"Accept": "application/json"}).get_json()["cycles"]
            [recorded] = [c for c in cycles if c["id"] == taken_over.cycle_id]
            assert recorded["errors"] == [] and recorded["outcome"] == "ok"
            assert "took over the sweep lease" in recorded["notes"][0]
    finally:
        alive.kill()
        alive.wait()


def test_once_the_provider_answers_again_work_backing_off_for_it_runs_within_one_sweep(build_app, sandbox):
    """Found by the long chaos run: a refund held back by an outage waited out its backoff (up to
    300 s) after the provider was back, and the run did not settle within a minute of quiet. A
    sweep whose provider answers (breaker closed, latest call a success) makes such rows due at
    once; a row waiting for anything else, or while the provider still fails, keeps its time."""
    app = build_app()
    with app.app_context():
        now = utcnow()
        later_at = now + timedelta(seconds=250)

        def command(**fields) -> int:
            row = ScheduledCommand(
                kind="refund_payment", order_id=None, payload={"refund_id": 0}, next_attempt_at=later_at, **fields
            )
            db.session.add(row)
            db.session.commit()
            return row.id

        waiting = command(failure_kind="provider", provider_waits=3, last_error="waiting for the provider")
        erring = command(failure_kind="error", attempts=1, last_error="ValueError")  # an ordinary retry
        future = command()  # a deadline not yet due

        def due(work_id) -> bool:
            return as_utc(db.session.get(ScheduledCommand, work_id).next_attempt_at) <= utcnow()

        provider = guard.get()
        provider.record(ok=False)  # the latest call failed: not evidence the provider is back
        assert sweep.wake_work_waiting_for_the_provider(now) == 0 and not due(waiting)
        provider.record(ok=True)
        sandbox.faults(api_unavailable=False)
        result = run_cycle(now=now)
        assert result.status == "ok" and result.provider["woken"] == 1  # the cycle's record says so
        db.session.expire_all()
        assert due(waiting) and not due(erring) and not due(future)
        row = db.session.get(ScheduledCommand, waiting)
        assert (row.status, row.attempts, row.provider_waits) == ("pending", 0, 3)  # nothing spent


# -- bounds and gates ------------------------------------------------------------------------


def test_one_cycle_handles_exactly_one_batch_oldest_first(build_app):
    app = build_app(RECONCILIATION_BATCH_SIZE=3)
    with app.app_context():
        orders = [place_order_for().order_id for _ in range(5)]
        for failed in orders[1::2]:  # two of them had a payment fail: PaymentFailed is unpaid too
            assert start_payment(failed).status == "started"
            gateway.expire_session(session_of(failed))
            assert reconcile_order(failed).outcome == "payment_failed"
        base = utcnow() - timedelta(hours=2)
        ages = {orders[0]: 50, orders[1]: 10, orders[2]: 40, orders[3]: 20, orders[4]: 30}  # minutes later than base
        for order_id, minutes in ages.items():
            backdate(order_id, base + timedelta(minutes=minutes))
        young = place_order_for().order_id

        result = run_cycle()  # real time: only the backdated ones are past the cutoff

        assert result.expiry["cancelled"] == 3
        oldest_three = sorted(ages, key=ages.get)[:3]
        assert sorted(o for o in orders if order_state(o) == "Cancelled") == sorted(oldest_three)
        assert order_state(young) == "PendingPayment"
        assert run_cycle().expiry["cancelled"] == 2


def test_with_reconciliation_off_the_expiry_pass_still_cancels_and_nobody_asks_the_provider(build_app, sandbox):
    app = build_app(RECONCILIATION_ENABLED=False)
    with app.app_context():
        stranded = place_order_for().order_id
        waiting, sid = awaiting_provider()
        sandbox.set_outcome(sid, "paid")

        result = run_cycle(now=later(app))

        assert result.status == "ok" and result.provider is None
        assert order_state(stranded) == "Cancelled"
        assert order_state(waiting) == "PaymentInitiated"
        assert session_reads(sandbox) == 0
        assert "provider pass: off" in "\n".join(result.report_lines())


def test_with_expiry_off_the_provider_pass_still_applies_payments(build_app, sandbox):
    app = build_app(UNPAID_ORDER_EXPIRY_ENABLED=False)
    with app.app_context():
        stranded = place_order_for().order_id
        waiting, sid = awaiting_provider()
        sandbox.set_outcome(sid, "paid")

        result = run_cycle(now=later(app))

        assert result.status == "ok" and result.expiry is None
        assert order_state(stranded) == "PendingPayment"
        assert order_state(waiting) == "Paid"


# -- what the operator sees ------------------------------------------------------------------


def test_each_cycle_is_recorded_and_the_command_prints_one_line_per_pass(build_app, sandbox):
    app = build_app()
    with app.app_context():
        place_order_for()
        order_id, sid = awaiting_provider()
        sandbox.set_outcome(sid, "paid")
        for (oid,) in db.session.execute(select(Order.id)).all():
            backdate(oid, utcnow() - timedelta(hours=1))

    out = app.test_cli_runner().invoke(args=["shop", "sweep"])

    assert out.exit_code == 0, out.output
    assert "expiry pass: 1 cancelled, 0 lost races" in out.output
    assert "provider pass: 1 paid, 0 payment failed, 0 unavailable" in out.output
    with app.app_context():
        cycle = db.session.query(ReconciliationCycle).one()
        assert cycle.status == "ok" and cycle.finished_at is not None
        assert cycle.expiry_counts["cancelled"] == 1 and cycle.provider_counts["paid"] == 1
        finished = cycle.finished_at.timestamp()
        db.session.rollback()
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    line = next(l for l in metrics.splitlines() if l.startswith("shop_reconciliation_last_success_timestamp_seconds"))
    assert float(line.split()[-1]) == pytest.approx(finished)


def test_orders_whose_provider_answer_cannot_change_soon_do_not_starve_the_batch(build_app, sandbox):
    """A refused payment proof waits for an operator: re-asking about it every cycle would keep
    the oldest such orders at the head of every batch, and younger stuck orders would never be
    reconciled. The sweep backs them off without touching their version or their age."""
    app = build_app(RECONCILIATION_BATCH_SIZE=1)
    with app.app_context():
        refused, refused_sid = awaiting_provider()
        younger, younger_sid = awaiting_provider()
        sandbox.faults(drop_webhooks=10)
        sandbox.set_outcome(refused_sid, "paid")
        sandbox.set_outcome(younger_sid, "paid")
        # The oldest order's total no longer matches what was paid: its proof is refused.
        force_order(refused, total=1)
        backdate(refused, utcnow() - timedelta(hours=2))
        backdate(younger, utcnow() - timedelta(hours=1))
        version_before = db.session.get(Order, refused).version
        db.session.rollback()

        first = run_cycle()
        assert first.provider["proof_refused"] == 1
        second = run_cycle()
        assert second.provider["paid"] == 1, second.summary()
        assert order_state(younger) == "Paid"
        order = db.session.get(Order, refused)
        assert order.status == "PaymentInitiated" and order.version == version_before
        assert db.session.query(PaymentProofRefusal).filter_by(order_id=refused).count() == 1

        # The operator sees why the sweep skips it and until when, and can still ask by hand.
        reference, younger_ref = (db.session.get(Order, i).reference for i in (refused, younger))
        db.session.rollback()  # nothing held open while the console's requests write (SQLite)
        client = app.test_client()
        log_in(app, client)
        shown = client.get(f"/console/orders/{reference}", headers={"Accept": "application/json"}).get_json()
        next_check = datetime.fromisoformat(shown["order"]["provider_next_check_at"])
        assert utcnow() + timedelta(hours=5) < next_check <= utcnow() + timedelta(hours=6)
        page = client.get(f"/console/orders/{reference}").get_data(as_text=True)
        assert "the sweep leaves this order alone until" in page
        assert (
            client.get(f"/console/orders/{younger_ref}", headers={"Accept": "application/json"}).get_json()["order"][
                "provider_next_check_at"
            ]
            is None
        )


def test_an_async_payment_settling_with_its_webhook_lost_is_found_within_the_first_backoff_steps(build_app, sandbox):
    """The sweep found the order awaiting its async payment; the bank then
    settled and that one webhook was dropped. The next check comes one sweep interval later (not
    an hour), and the console says when in words."""
    import re

    app = build_app()
    interval = app.config["RECONCILIATION_INTERVAL_SECONDS"]
    with app.app_context():
        order_id, sid = awaiting_provider()
        sandbox.faults(drop_webhooks=10)
        sandbox.set_outcome(sid, "async_pending")
        # The payment window closed a minute ago.
        backdate(order_id, utcnow() - timedelta(seconds=app.config["RECONCILIATION_STUCK_AGE_SECONDS"] + 60))
        assert run_cycle().provider["awaiting_async"] == 1
        reference = db.session.get(Order, order_id).reference
        db.session.rollback()

        client = app.test_client()
        log_in(app, client)
        shown = client.get(f"/console/orders/{reference}", headers={"Accept": "application/json"}).get_json()
        next_check = datetime.fromisoformat(shown["order"]["provider_next_check_at"])
        assert utcnow() < next_check <= utcnow() + timedelta(seconds=interval)
        page = client.get(f"/console/orders/{reference}").get_data(as_text=True)
        until = r"the sweep leaves this order alone until <time datetime=[^>]*>[-0-9: ]+UTC</time> \(in [45] min\)"
        assert re.search(until, page), page

        sandbox.async_result(sid, "succeeded")  # dropped: only the sweep can notice
        # A cycle that comes before the check is due leaves the order alone...
        assert run_cycle().provider["paid"] == 0
        # ...and the next cycle, one interval later, asks and applies the payment.
        later_cycle = run_cycle(now=utcnow() + timedelta(seconds=interval + 5))
        assert later_cycle.provider["paid"] == 1, later_cycle.summary()
        assert order_state(order_id) == "Paid"


def test_a_payment_that_keeps_settling_is_asked_about_less_and_less_often_up_to_the_cap(build_app, sandbox):
    """Checks spread out with the time the order has been stuck, never beyond the cap: a payment
    that settles in days costs a few provider calls an hour, and a lost webhook at most the cap."""
    app = build_app()
    interval = app.config["RECONCILIATION_INTERVAL_SECONDS"]
    with app.app_context():
        order_id, sid = awaiting_provider()
        sandbox.faults(drop_webhooks=10)
        sandbox.set_outcome(sid, "async_pending")
        closed = utcnow() - timedelta(seconds=10)
        backdate(order_id, closed - timedelta(seconds=app.config["RECONCILIATION_STUCK_AGE_SECONDS"]))
        asked = []
        for cycle in range(1, 12):
            result = run_cycle(now=closed + timedelta(seconds=cycle * interval))
            if result.provider["awaiting_async"]:
                asked.append(cycle)
        gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
        assert asked[:2] == [1, 2] and max(gaps) == RECHECK_CAP_INTERVALS["awaiting_async"], asked
        assert gaps == sorted(gaps)


def test_a_frozen_lease_holder_blocks_until_its_lease_lapses_then_yields_every_order_it_had_not_reached(build_app):
    """A real `flask shop sweep` stopped by SIGSTOP mid-cycle is alive, not gone: its lease holds
    until it lapses. Then the next cycle takes it over, and the frozen one, resumed, stops before
    its next order instead of working alongside: every order is cancelled once, by one of them."""
    import signal
    import subprocess

    lease = 3
    app = build_app()
    with app.app_context():
        ids = [place_order_for().order_id for _ in range(5)]
        for order_id in ids:
            backdate(order_id, utcnow() - timedelta(hours=1))
        env = process_env(
            app, BACKSTOP_FAILPOINTS="sweep.after_order=sleep:0.4", BACKSTOP_RECONCILIATION_LEASE_SECONDS=str(lease)
        )
        child = subprocess.Popen(
            flask_command() + ["--app", "app", "shop", "sweep"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def cancelled_one() -> int:
                assert child.poll() is None, child.stdout.read().decode()
                return sum(order_state(o) == "Cancelled" for o in ids)

            wait_until(cancelled_one, 60, "the child's cycle to cancel an order", interval=0.02)
            stop_between_writes(child, app.config["SQLALCHEMY_DATABASE_URI"])  # the test writes next
            # A commit the child sent before it stopped may still be landing: no state of ours
            # says when it has, so the count waits this long for it (a sleep: nothing to wait on).
            time.sleep(0.2)
            done_by_child = sum(order_state(o) == "Cancelled" for o in ids)
            holder = db.session.execute(select(Lease.holder)).scalar_one()
            db.session.rollback()
            assert holder.split(":")[1] == str(child.pid)

            stalled = run_cycle(now=utcnow())
            assert stalled.status == "skipped", "a stopped process is alive: its lease is not taken early"
            assert sum(order_state(o) == "Cancelled" for o in ids) == done_by_child

            # Once its lease has lapsed (the cycle's clock put past it, instead of waiting for it).
            taken_over = run_cycle(now=utcnow() + timedelta(seconds=lease + 0.5))
            assert taken_over.status == "ok", taken_over.report_lines()
            assert taken_over.expiry["cancelled"] == len(ids) - done_by_child
        finally:
            os.kill(child.pid, signal.SIGCONT)
            report = child.communicate(timeout=60)[0].decode()
        assert child.returncode == 1 and "lost the lease" in report, report
        assert f"expiry pass: {done_by_child} cancelled" in report, report
        cancels = (
            db.session.execute(select(OutboxEvent.order_id).where(OutboxEvent.name == "OrderCancelled")).scalars().all()
        )
        db.session.rollback()
        assert sorted(cancels) == sorted(ids), "each order cancelled exactly once"
