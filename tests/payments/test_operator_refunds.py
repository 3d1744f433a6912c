"""An operator refunds a paid order, in full or in parts, through the provider's real refund API
(the sandbox over HTTP): a double submit refunds once, no refund takes more than is left, and
the stock an operator puts back with a refund comes back once, whatever restore runs after."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from factories import force_order, on_hand, seed_catalog_rows
from payment_helpers import Shopper, order_id, place_and_pay, run_due_commands
from shop.domain.deadlines import utcnow
from shop.domain.events import OrderCancelled
from shop.extensions import db
from shop.models import Order, Refund
from shop.orders.cancel import CancelStatus, cancel_order
from shop.outbox import uow
from shop.saga.inventory import RestoreOutcome, restore_inventory
from shop.saga.operator_refunds import RefundOutcome, refund_order, refundable_now

OPERATOR = "night-shift@example.com"


@pytest.fixture
def paid(monkeypatch, tmp_path, make_fresh_app, sandbox):
    """A paid order of 2 x SOCK-M: (app, order id, its total, the sock's variant id). Its mail
    (the refund's email) goes to this test's own folder."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    app, oid, total, skus = place_and_pay(make_fresh_app, sandbox, "SOCK-M", 2)
    return app, oid, total, skus["SOCK-M"]


def _refund(app, oid, amount, key, *, restock=False, reason="customer kept one sock"):
    with app.app_context():
        result = refund_order(oid, amount=amount, reason=reason, restock=restock, request_key=key, operator=OPERATOR)
        db.session.remove()
        return result


def _refunds(app, oid):
    with app.app_context():
        rows = db.session.execute(select(Refund).where(Refund.order_id == oid).order_by(Refund.id)).scalars().all()
        db.session.expunge_all()
        db.session.remove()
        return rows


def _at_provider(sandbox, app, oid):
    """(amount refunded on the charge, [refund amounts]) at the sandbox for the order's payment."""
    with app.app_context():
        session_id = db.session.get(Order, oid).payment_session_id
        db.session.remove()
    with sandbox.sandbox.lock:
        state = sandbox.sandbox
        intent = state.sessions[session_id].payment_intent_id
        charge = state.charges[state.payment_intents[intent].latest_charge]
        return charge.amount_refunded, sorted(r.amount for r in state.refunds.values() if r.payment_intent_id == intent)


def test_a_double_submitted_refund_refunds_once_at_the_provider(paid, sandbox, tmp_path):
    app, oid, total, _ = paid
    first = _refund(app, oid, 300, "key-double-submit-0001")
    again = _refund(app, oid, 300, "key-double-submit-0001")
    assert (first.outcome, again.outcome) == (RefundOutcome.DONE, RefundOutcome.ALREADY)
    # The second is answered with what the first did: its refund, its amount, no stock put back.
    assert (again.refund_id, again.amount, again.restocked, again.given) == (first.refund_id, 300, False, ())
    run_due_commands(app, utcnow())
    run_due_commands(app, utcnow())  # a re-run of the command replays under its Idempotency-Key
    [refund] = _refunds(app, oid)
    assert (refund.amount, refund.status, refund.requested_by) == (300, "succeeded", OPERATOR)
    assert _at_provider(sandbox, app, oid) == (300, [300])
    # The customer hears of it once the provider says it succeeded, in words for a paid order.
    run_due_commands(app, utcnow())
    [mail] = sorted((tmp_path / "instance" / "mail").glob("*refund_issued*.eml"))
    body = mail.read_text()
    assert "We refunded $3.00 of your payment" in body and "arrived after the order was cancelled" not in body


def test_partial_refunds_never_take_more_than_is_left(paid, sandbox):
    app, oid, total, _ = paid
    assert _refund(app, oid, total - 100, "key-partial-000001").outcome is RefundOutcome.DONE
    too_much = _refund(app, oid, 101, "key-partial-000002")
    assert (too_much.outcome, too_much.why, too_much.amount, too_much.left) == (
        RefundOutcome.REFUSED,
        "over_refundable",
        101,
        100,
    )
    zero = _refund(app, oid, 0, "key-partial-000003")
    assert (zero.outcome, zero.why) == (RefundOutcome.REFUSED, "not_positive")
    no_reason = _refund(app, oid, 50, "key-partial-000004", reason="  ")
    assert (no_reason.outcome, no_reason.why) == (RefundOutcome.REFUSED, "no_reason")
    rest = _refund(app, oid, 100, "key-partial-000005")
    assert (rest.outcome, rest.left) == (RefundOutcome.DONE, 0)
    nothing = _refund(app, oid, 1, "key-partial-000006")
    assert (nothing.outcome, nothing.why) == (RefundOutcome.REFUSED, "nothing_left")
    run_due_commands(app, utcnow())
    assert [r.status for r in _refunds(app, oid)] == ["succeeded", "succeeded"]
    assert _at_provider(sandbox, app, oid) == (total, [100, total - 100])


def test_a_refund_of_an_order_that_is_not_paid_is_refused_and_writes_nothing(fresh_paying_app, sandbox):
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    oid = order_id(app, shopper.place("SOCK-M", 1)["reference"])
    result = _refund(app, oid, 100, "key-unpaid-0000001")
    assert (result.outcome, result.why) == (RefundOutcome.REFUSED, "not_paid")
    assert _refunds(app, oid) == []


def test_a_refund_of_no_such_order_is_missing_and_writes_nothing(paid):
    app, oid, total, _ = paid
    assert _refund(app, oid + 1000, 100, "key-missing-000001").outcome is RefundOutcome.MISSING
    assert _refunds(app, oid + 1000) == [] and _refunds(app, oid) == []


def test_a_refund_without_an_amount_takes_all_that_is_left_and_then_finds_nothing_left(paid):
    app, oid, total, _ = paid
    assert _refund(app, oid, total - 1, "key-rest-00000001").left == 1
    rest = _refund(app, oid, None, "key-rest-00000002")  # a single minor unit is still something left
    assert (rest.outcome, rest.amount, rest.left) == (RefundOutcome.DONE, 1, 0)
    nothing = _refund(app, oid, None, "key-rest-00000003")
    assert (nothing.outcome, nothing.why, nothing.left) == (RefundOutcome.REFUSED, "nothing_left", 0)
    assert [r.amount for r in _refunds(app, oid)] == [total - 1, 1]


def test_what_is_left_to_refund_is_what_the_payment_charged_or_the_total_for_an_older_payment(paid):
    """`charged` is the total plus any tax the provider added; a payment saved before the column
    existed has none and charged exactly the total."""
    app, oid, total, _ = paid
    with app.app_context():
        force_order(oid, charged=None)
        db.session.remove()
    older = _refund(app, oid, total + 1, "key-charged-000001")
    assert (older.outcome, older.why, older.left) == (RefundOutcome.REFUSED, "over_refundable", total)
    with app.app_context():
        force_order(oid, charged=total + 150)
        db.session.remove()
    taxed = _refund(app, oid, None, "key-charged-000002")
    assert (taxed.outcome, taxed.amount, taxed.left) == (RefundOutcome.DONE, total + 150, 0)


def test_a_refund_of_an_earlier_payment_attempt_leaves_what_the_paid_one_can_refund(paid):
    """Late money of an earlier session of the order, refunded on its own row, is not part of
    the payment that paid the order: it takes nothing from what is left of that one."""
    app, oid, total, _ = paid
    with app.app_context():
        order = db.session.get(Order, oid)
        db.session.add(
            Refund(
                order_id=oid,
                session_id="cs_test_an_earlier_attempt",
                amount=500,
                currency=order.currency,
                reason="late",
            )
        )
        db.session.commit()
        assert refundable_now(oid) == total
        db.session.remove()
    assert _refund(app, oid, None, "key-attempts-000001").amount == total


@pytest.mark.postgres
def test_a_refund_decides_on_the_order_as_committed_not_as_the_callers_session_last_read_it(paid, is_postgres):
    """The caller read the order in its transaction; meanwhile another writer put its stock back.
    The refund reads the row again after locking it and refuses to put the stock back twice.
    (SQLite's transaction holds the write lock from its first statement: no writer comes between.)"""
    if not is_postgres:
        pytest.skip("a writer between a transaction's read and its lock is PostgreSQL's")
    app, oid, total, _ = paid
    with app.app_context():
        loaded = db.session.get(Order, oid)  # held: the session's identity map keeps it
        assert loaded.inventory_restored is False
        force_order(oid, elsewhere=True, inventory_restored=True)
        result = refund_order(
            oid, amount=100, reason="kept one", restock=True, request_key="key-stale-00000001", operator=OPERATOR
        )
        db.session.remove()
    assert (result.outcome, result.why) == (RefundOutcome.REFUSED, "already_restocked")
    assert _refunds(app, oid) == []


def test_restock_with_a_refund_gives_the_stock_back_once_even_when_a_restore_runs_after(paid):
    app, oid, total, sock = paid
    before = on_hand(sock, app)
    done = _refund(app, oid, 100, "key-restock-000001", restock=True)
    assert (done.outcome, done.restocked) == (RefundOutcome.DONE, True)
    assert on_hand(sock, app) == before + 2
    # A second refund cannot put the stock back again...
    again = _refund(app, oid, 100, "key-restock-000002", restock=True)
    assert (again.outcome, again.why) == (RefundOutcome.REFUSED, "already_restocked")
    # ...nor can the compensation, should an OrderCancelled of this order ever be (re)delivered...
    with app.app_context():
        with uow.transaction():
            assert restore_inventory(OrderCancelled(oid, "redelivered"), utcnow()) is RestoreOutcome.ALREADY_RESTORED
        # ...and a paid order is not cancelled at all.
        assert cancel_order(oid, None).status is not CancelStatus.CANCELLED
        db.session.remove()
    assert on_hand(sock, app) == before + 2
    # The double submit of the restocking refund restocks nothing more either; its answer says
    # what the first put back.
    twice = _refund(app, oid, 100, "key-restock-000001", restock=True)
    assert (twice.outcome, twice.amount, twice.restocked) == (RefundOutcome.ALREADY, 100, True)
    assert [(g.quantity, g.on_hand_after - g.on_hand_before) for g in twice.given] == [(2, 2)]
    assert on_hand(sock, app) == before + 2


def test_a_refund_without_restock_leaves_the_stock_and_the_marker_alone(paid):
    app, oid, total, sock = paid
    before = on_hand(sock, app)
    assert _refund(app, oid, total, "key-no-restock-0001").outcome is RefundOutcome.DONE
    assert on_hand(sock, app) == before
    with app.app_context():
        assert db.session.get(Order, oid).inventory_restored is False
        db.session.remove()


def test_a_refund_whose_key_another_submission_committed_after_its_check_answers_with_that_one(paid, monkeypatch):
    """The winner commits between the loser's look for an earlier refund and its insert (a race
    PostgreSQL allows, made here on purpose): the key's unique index refuses the loser's row, which
    rolls back whole, and the loser answers with the winner's refund."""
    from shop.saga import operator_refunds
    from support import first_look_misses

    app, oid, total, _ = paid
    key = "key-late-check-0001"
    winner = _refund(app, oid, 300, key)
    looks = first_look_misses(monkeypatch, operator_refunds)
    loser = _refund(app, oid, 300, key)

    assert (loser.outcome, loser.refund_id, loser.amount, looks) == (
        RefundOutcome.ALREADY,
        winner.refund_id,
        300,
        [key, key],
    )
    assert [r.amount for r in _refunds(app, oid)] == [300]


@pytest.mark.postgres
def test_two_submissions_of_one_refund_at_once_refund_once(paid, is_postgres):
    if not is_postgres:
        pytest.skip("concurrency is PostgreSQL's")
    from support import run_threads

    app, oid, total, sock = paid
    before = on_hand(sock, app)

    def submit(_):
        return refund_order(
            oid, amount=200, reason="twice at once", restock=True, request_key="key-race-00000001", operator=OPERATOR
        ).outcome

    results, errors = run_threads(app, [1, 2, 3], submit)
    assert errors == [None, None, None]
    assert sorted(results) == sorted([RefundOutcome.DONE, RefundOutcome.ALREADY, RefundOutcome.ALREADY])
    assert [r.amount for r in _refunds(app, oid)] == [200]
    assert on_hand(sock, app) == before + 2


def test_a_pending_operator_refund_whose_failure_webhook_is_lost_is_found_failed_by_the_sweep(paid, sandbox):
    """No watch follows a paid order (the late-money watch is a cancelled order's): without the
    sweep's follow-up of pending refunds, the refund would stay pending for ever and nobody would
    learn that the money never went back. No webhook reaches this app at all."""
    from datetime import timedelta

    from shop.scheduling.sweep import run_cycle

    app, oid, total, _ = paid
    sandbox.faults(refunds_pending=True)
    assert _refund(app, oid, 500, "key-pending").outcome == RefundOutcome.DONE
    run_due_commands(app, utcnow())  # the refund command: the provider answers "pending"
    [refund] = _refunds(app, oid)
    assert refund.status == "pending" and refund.provider_refund_id
    sandbox.refund_outcome(refund.provider_refund_id, "failed")  # the bank refuses; the webhook is lost

    with app.app_context():
        soon = run_cycle(now=utcnow() + timedelta(seconds=1))  # heard of just now: not asked yet
        assert soon.provider.get("refund_failed", 0) == 0
        later = run_cycle(now=utcnow() + timedelta(minutes=15))
        assert later.provider.get("refund_failed") == 1, later.summary()
        again = run_cycle(now=utcnow() + timedelta(minutes=45))  # no longer pending: not asked again
        assert again.provider.get("refund_failed", 0) == 0 and again.provider.get("refund_under_way", 0) == 0
        db.session.remove()
    [failed] = _refunds(app, oid)
    assert failed.status == "failed" and failed.failed_at is not None


def test_a_still_pending_operator_refund_is_asked_about_at_growing_intervals_not_every_cycle(paid, sandbox):
    from datetime import timedelta

    from shop.scheduling.sweep import run_cycle

    app, oid, total, _ = paid
    sandbox.faults(refunds_pending=True)
    _refund(app, oid, 500, "key-slow")
    run_due_commands(app, utcnow())
    [refund] = _refunds(app, oid)
    assert refund.status == "pending" and refund.provider_refund_id, (refund.status, refund.provider_refund_id)
    asked = lambda: sandbox.request_count(method="GET", path_prefix=f"/v1/refunds/{refund.provider_refund_id}")  # noqa: E731
    start = utcnow()
    with app.app_context():
        first = run_cycle(now=start + timedelta(minutes=15))
        assert first.provider.get("refund_under_way") == 1 and asked() == 1
        run_cycle(now=start + timedelta(minutes=15, seconds=30))  # heard of 30 s ago: too soon
        assert asked() == 1
        run_cycle(now=start + timedelta(hours=3))
        assert asked() == 2
        db.session.remove()


def test_what_is_left_to_refund_is_the_charge_less_its_refunds_and_nothing_for_an_order_not_paid(paid):
    # What the refund form offers (operator_refunds.refundable_now).
    app, oid, total, _ = paid
    with app.app_context():
        assert (refundable_now(oid), refundable_now(oid + 1000)) == (total, None)
        db.session.remove()
    assert _refund(app, oid, 150, "key-left-0000000001").outcome is RefundOutcome.DONE
    with app.app_context():
        assert refundable_now(oid) == total - 150
        force_order(oid, charged=total + 40)  # the charge with tax on top: what can go back
        assert refundable_now(oid) == total + 40 - 150
        force_order(oid, charged=None)  # a payment saved before the charge was: it charged the total
        assert refundable_now(oid) == total - 150
        session_id = db.session.get(Order, oid).payment_session_id
        force_order(oid, payment_session_id=None)
        assert refundable_now(oid) is None  # paid, but with no payment to refund
        force_order(oid, payment_session_id=session_id, status="Cancelled")
        assert refundable_now(oid) is None
        db.session.remove()


def test_a_paid_order_with_no_payment_to_refund_is_refused_as_such(paid):
    app, oid, _, _ = paid
    with app.app_context():
        force_order(oid, payment_session_id=None)
        db.session.remove()
    refused = _refund(app, oid, 100, "key-no-payment-0001")
    assert (refused.outcome, refused.why, refused.status) == (RefundOutcome.REFUSED, "no_payment", "Paid")
    assert _refunds(app, oid) == []
