"""Money the provider holds for an order this database does not know is never kept.

A database restored from a backup is behind the provider: sessions paid after the copy was taken
name orders the copy never had (or had without their session), and the machine that was lost may
have answered their webhooks already. Each test builds that situation the way a copy sees it: a
session at the real sandbox, made with the shop's own metadata for an order the database lacks
(or lacks the session of), then paid; and checks that the webhook or the sweep's scan finds the
money and applies it to the order or refunds it, once (docs/REFERENCE.md, "Guarantees")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event

from factories import on_hand, seed_catalog_rows
from payment_helpers import (
    Shopper,
    order_id,
    paid_at_provider,
    post_webhook,
    run_due_commands,
    run_everything,
    sandbox_event,
)
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order, Refund, ScheduledCommand, UnknownPayment
from shop.provider import gateway
from shop.provider.mark import shop_mark


def _session_for(app, sandbox, *, order_id: int, reference: str, amount: int = 2500, marked: bool = True) -> str:
    """A session made exactly as the shop makes one (through the real SDK), for an order the
    database may not have; returns its id."""
    with app.app_context():
        metadata = {"order_id": str(order_id), "reference": reference}
        if marked:
            metadata["shop"] = shop_mark()
        session = gateway.client().v1.checkout.sessions.create(
            params={
                "mode": "payment",
                "client_reference_id": reference,
                "metadata": metadata,
                "customer_email": "lost@example.com",
                "success_url": "http://shop.test/return",
                "cancel_url": "http://shop.test/cancel",
                "line_items": [
                    {
                        "quantity": 1,
                        "price_data": {"currency": "usd", "unit_amount": amount, "product_data": {"name": "Lost"}},
                    }
                ],
            }
        )
        db.session.remove()
        return session.id


def _placed_while_the_provider_was_down(app, sandbox) -> tuple[Shopper, dict, int]:
    """An order the copy has without its payment page: placed while the provider did not answer."""
    shopper = Shopper(app, seed_catalog_rows(app))
    sandbox.faults(api_unavailable=True)
    assert shopper.checkout("SOCK-M", 1).status_code == 303
    sandbox.faults(api_unavailable=False)
    order = shopper.latest()
    return shopper, order, order_id(app, order["reference"])


def _provider_refunds(app, sid: str) -> list[tuple[int, str]]:
    with app.app_context():
        intent = gateway.retrieve_session(sid).payment_intent
        page = gateway.client().v1.refunds.list(params={"payment_intent": intent, "limit": 100})
        db.session.remove()
        return [(r.amount, r.status) for r in page.auto_paging_iter()]


def _unknown(app) -> list[UnknownPayment]:
    with app.app_context():
        rows = db.session.query(UnknownPayment).order_by(UnknownPayment.id).all()
        db.session.expunge_all()
        db.session.remove()
        return rows


def _was_sweeping(app) -> None:
    """The shop ran its sweep before the payment: its scan's mark is older than the payment, as a
    restored copy's mark is older than what the copy lost (a new database starts the mark at its
    first cycle, since nothing older can be a payment for an order it lacks)."""
    from shop.scheduling.sweep import run_cycle

    with app.app_context():
        run_cycle()
        db.session.remove()


def _sweep(app, *, minutes_later: float = 2):
    """One sweep cycle as if run a little later (the scan leaves the last minute to the webhooks),
    then the commands it wrote, as a worker runs them."""
    from shop.scheduling.sweep import run_cycle

    later = utcnow() + timedelta(minutes=minutes_later)
    with app.app_context():
        result = run_cycle(now=later)
        db.session.remove()
    run_due_commands(app, later + timedelta(minutes=1))  # what the cycle wrote, due during it
    return result


def test_a_signed_webhook_for_an_order_the_database_lacks_is_checked_with_the_provider_and_refunded_once(
    fresh_paying_app, sandbox
):
    app = fresh_paying_app
    seed_catalog_rows(app)
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=424242, reference="BK-LQSTRDER")
    sandbox.set_outcome(sid, "paid")
    event = sandbox_event(sandbox, "checkout.session.completed", sid)

    client = app.test_client()
    assert post_webhook(client, event).status_code == 200
    assert post_webhook(client, {**event, "id": event["id"] + "x"}).status_code == 200  # told again
    [row] = _unknown(app)
    assert (row.session_id, row.status, row.reference, row.found_via) == (sid, "checking", "BK-LQSTRDER", "webhook")

    run_due_commands(app, utcnow() + timedelta(seconds=1))
    run_due_commands(app, utcnow() + timedelta(minutes=5))
    [row] = _unknown(app)
    assert row.status in ("refunded", "refund_pending"), row.detail
    assert _provider_refunds(app, sid) == [(2500, "succeeded")]
    # The scan later sees the same payment and leaves it: it is accounted for.
    _sweep(app)
    assert len(_unknown(app)) == 1 and _provider_refunds(app, sid) == [(2500, "succeeded")]


def test_a_forged_paid_notice_for_an_unknown_session_is_refused_by_the_provider_check_and_refunds_nothing(
    fresh_paying_app, sandbox
):
    """The webhook is signed, but the check asks the provider, which has a session that took no money."""
    app = fresh_paying_app
    seed_catalog_rows(app)
    sid = _session_for(app, sandbox, order_id=5151, reference="BK-NQTPA1DX")  # open, never paid
    with app.app_context():
        session = gateway.client().v1.checkout.sessions.retrieve(sid).to_dict()
        db.session.remove()
    forged = {
        "id": "evt_forged_1",
        "object": "event",
        "type": "checkout.session.completed",
        "created": int(utcnow().timestamp()),
        "data": {"object": {**session, "status": "complete", "payment_status": "paid"}},
    }
    assert post_webhook(app.test_client(), forged).status_code == 200
    run_due_commands(app, utcnow() + timedelta(seconds=1))
    [row] = _unknown(app)
    assert row.status == "not_paid", row.detail
    assert _provider_refunds(app, sid) == []


def test_the_sweep_finds_money_whose_webhook_the_lost_machine_answered_and_refunds_it(fresh_paying_app, sandbox):
    """No endpoint is registered for this app: only the scan of the provider's payments can see it."""
    app = fresh_paying_app
    seed_catalog_rows(app)
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=77, reference="BK-GQNEW4YS", amount=1800)
    sandbox.set_outcome(sid, "paid")

    first = _sweep(app)
    assert first.provider.get("unknown_order") == 1, first.summary()
    assert first.provider.get("money_pages", 0) >= 1
    [row] = _unknown(app)
    assert (row.found_via, row.status) == ("sweep: unknown money", "refunded"), row.detail
    assert _provider_refunds(app, sid) == [(1800, "succeeded")]
    # The mark moved past it: the next cycle neither records nor refunds it again.
    again = _sweep(app)
    assert again.provider.get("unknown_order", 0) == 0
    assert len(_unknown(app)) == 1 and _provider_refunds(app, sid) == [(1800, "succeeded")]


def test_an_order_restored_without_its_session_is_paid_by_the_scan_not_cancelled_with_the_money_kept(
    fresh_paying_app, sandbox
):
    """The copy has the order (PendingPayment, no session: its checkout was waiting on the provider
    when the copy was taken); the customer paid the session the lost machine made."""
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    sandbox.faults(api_unavailable=True)
    r = shopper.checkout("SOCK-M", 1)
    sandbox.faults(api_unavailable=False)
    assert r.status_code == 303
    order = shopper.latest()
    assert (
        order["status"] == "PendingPayment" and order["payment"] in (None, {}) or not order["payment"].get("session_id")
    )
    oid = order_id(app, order["reference"])
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=oid, reference=order["reference"], amount=order["total"])
    sandbox.set_outcome(sid, "paid")

    result = _sweep(app, minutes_later=1.5)
    assert result.provider.get("paid") == 1, result.summary()
    paid = shopper.order(order["reference"])
    assert paid["status"] == "Paid" and paid["payment"]["session_id"] == sid
    assert _unknown(app) == [] and _provider_refunds(app, sid) == []


def test_a_cancelled_order_restored_without_its_session_gets_its_late_money_refunded(fresh_paying_app, sandbox):
    app = fresh_paying_app
    shopper, order, oid = _placed_while_the_provider_was_down(app, sandbox)
    assert shopper.cancel(order["reference"], order["version"]).get_json()["status"] == "Cancelled"
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=oid, reference=order["reference"], amount=order["total"])
    sandbox.set_outcome(sid, "paid")

    result = _sweep(app)
    assert result.provider.get("refund_created") == 1, result.summary()
    with app.app_context():
        [refund] = db.session.query(Refund).filter_by(order_id=oid).all()
        assert refund.session_id == sid
        db.session.remove()
    run_due_commands(app, utcnow() + timedelta(minutes=3))
    assert _provider_refunds(app, sid) == [(order["total"], "succeeded")]
    assert shopper.order(order["reference"])["status"] == "Cancelled"


def test_a_session_naming_a_reused_order_id_is_not_applied_to_the_order_that_now_holds_the_id(
    fresh_paying_app, sandbox
):
    """A restored copy hands the ids of the orders it lost to new ones: the session's reference,
    random and never reused, decides which order it is."""
    app = fresh_paying_app
    shopper, order, oid = _placed_while_the_provider_was_down(app, sandbox)
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=oid, reference="BK-QTHERQNE", amount=order["total"])
    sandbox.set_outcome(sid, "paid")

    _sweep(app, minutes_later=1.5)
    assert shopper.order(order["reference"])["status"] == "PendingPayment"  # not paid by another's money
    [row] = _unknown(app)
    assert row.status == "refunded" and row.reference == "BK-QTHERQNE"
    assert _provider_refunds(app, sid) == [(order["total"], "succeeded")]


def test_unknown_money_without_the_shops_mark_is_shown_to_an_operator_not_refunded(fresh_paying_app, sandbox):
    """Another integration on the same provider account: its payments are not this shop's to give back."""
    app = fresh_paying_app
    seed_catalog_rows(app)
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=9, reference="BK-QTHERAPP", marked=False)
    sandbox.set_outcome(sid, "paid")
    _sweep(app)
    [row] = _unknown(app)
    assert row.status == "not_ours", row.detail
    assert _provider_refunds(app, sid) == []


def test_the_shops_mark_is_on_every_session_it_makes_and_is_the_same_for_a_copy_under_the_same_key(
    fresh_paying_app, sandbox, make_fresh_app
):
    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    order = shopper.place("SOCK-M", 1)
    with app.app_context():
        mark = shop_mark()
        view = gateway.retrieve_session(order["payment"]["session_id"])
        db.session.remove()
    assert view.shop_mark == mark and mark.startswith("bk_")
    assert app.config["SECRET_KEY"] not in mark
    other = make_fresh_app(SECRET_KEY="another shop's key")
    with other.app_context():
        assert shop_mark() != mark


@pytest.mark.parametrize("delay_minutes", [0.5])
def test_the_scan_leaves_the_last_minute_to_the_webhooks(fresh_paying_app, sandbox, delay_minutes):
    app = fresh_paying_app
    seed_catalog_rows(app)
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=31, reference="BK-RECENT23")
    sandbox.set_outcome(sid, "paid")
    result = _sweep(app, minutes_later=delay_minutes)
    assert result.provider.get("unknown_order", 0) == 0 and _unknown(app) == []
    with app.app_context():
        assert db.session.query(ScheduledCommand).filter_by(kind="settle_unknown_payment").count() == 0
        assert db.session.query(Order).count() == 0
        db.session.remove()


def test_the_console_refunds_page_lists_unknown_money_with_what_happened_to_it(fresh_paying_app, sandbox):
    from support import log_in

    app = fresh_paying_app
    seed_catalog_rows(app)
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=12, reference="BK-C0NSQLE2".replace("0", "Q"))
    sandbox.set_outcome(sid, "paid")
    _sweep(app)
    client = app.test_client()
    log_in(app, client)
    data = client.get("/console/refunds", headers={"Accept": "application/json"}).get_json()
    [shown] = data["unknown_payments"]
    assert data["unknown_payments_total"] == 1
    assert (shown["session_id"], shown["status"], shown["amount"], shown["needs_operator"]) == (
        sid,
        "refunded",
        2500,
        False,
    )
    page = client.get("/console/refunds", headers={"Accept": "text/html"}).get_data(as_text=True)
    assert "Payments for orders this shop does not know" in page and "BK-CQNSQLE2" in page


def _refund_as_the_lost_machine_did(app, *, order_id: int, sid: str, amount: int, reason: str) -> None:
    """The refund the machine a copy replaces made: the shop's own call, key and metadata."""
    with app.app_context():
        intent = gateway.retrieve_session(sid).payment_intent
        gateway.create_refund(order_id=order_id, session_id=sid, payment_intent=intent, amount=amount, reason=reason)
        db.session.remove()


def test_an_unpaid_order_whose_late_payment_the_lost_machine_refunded_is_cancelled_not_paid_by_the_copy(
    fresh_paying_app, sandbox
):
    """The copy has the order unpaid; after the copy was taken the lost machine cancelled it, the
    customer paid anyway and that machine refunded the late money. The scan finds the payment: the
    copy must not make the order Paid with money already given back (the money check of the restore
    drill), and must not refund it a second time."""
    from shop.payments.apply import PAID_AFTER_CANCEL

    app = fresh_paying_app
    shopper, order, oid = _placed_while_the_provider_was_down(app, sandbox)
    held = on_hand("SOCK-M", app)  # one sock less than seeded: the order holds it
    assert order["status"] == "PendingPayment"
    _was_sweeping(app)
    sid = _session_for(app, sandbox, order_id=oid, reference=order["reference"], amount=order["total"])
    sandbox.set_outcome(sid, "paid")
    _refund_as_the_lost_machine_did(app, order_id=oid, sid=sid, amount=order["total"], reason=PAID_AFTER_CANCEL)

    result = _sweep(app)
    assert result.provider.get("paid", 0) == 0, result.summary()
    seen = shopper.order(order["reference"])
    assert seen["status"] == "Cancelled", seen
    with app.app_context():
        [refund] = db.session.query(Refund).filter_by(order_id=oid).all()
        assert (refund.session_id, refund.reason) == (sid, PAID_AFTER_CANCEL)
        db.session.remove()
    run_everything(app, utcnow() + timedelta(minutes=3))
    with app.app_context():
        assert db.session.query(Refund).filter_by(order_id=oid).one().status == "succeeded"
        db.session.remove()
    assert _provider_refunds(app, sid) == [(order["total"], "succeeded")]  # the lost machine's, replayed
    assert on_hand("SOCK-M", app) == held + 1  # the compensation gave the cancelled order's sock back
    assert _unknown(app) == []
    # A later cycle changes nothing.
    _sweep(app, minutes_later=5)
    assert shopper.order(order["reference"])["status"] == "Cancelled"
    assert _provider_refunds(app, sid) == [(order["total"], "succeeded")]


def test_a_second_payment_the_lost_machine_refunded_does_not_pay_the_order_or_cancel_it(fresh_paying_app, sandbox):
    """Paid twice after the copy: the lost machine kept the first and refunded the second. Whichever
    the scan reads first, the copy ends with the order Paid by the first and the second refunded once."""
    from shop.payments.apply import PAID_TWICE

    app = fresh_paying_app
    shopper, order, oid = _placed_while_the_provider_was_down(app, sandbox)
    _was_sweeping(app)
    kept = _session_for(app, sandbox, order_id=oid, reference=order["reference"], amount=order["total"])
    second = _session_for(app, sandbox, order_id=oid, reference=order["reference"], amount=order["total"])
    sandbox.set_outcome(kept, "paid")
    sandbox.set_outcome(second, "paid")
    _refund_as_the_lost_machine_did(app, order_id=oid, sid=second, amount=order["total"], reason=PAID_TWICE)

    _sweep(app)
    run_due_commands(app, utcnow() + timedelta(minutes=3))
    seen = shopper.order(order["reference"])
    assert seen["status"] == "Paid" and seen["payment"]["session_id"] == kept, seen
    assert _provider_refunds(app, kept) == []
    assert _provider_refunds(app, second) == [(order["total"], "succeeded")]
    with app.app_context():
        [refund] = db.session.query(Refund).filter_by(order_id=oid).all()
        assert (refund.session_id, refund.status) == (second, "succeeded")
        db.session.remove()


def test_the_deadline_of_an_order_whose_payment_the_lost_machine_refunded_cancels_it_without_a_second_refund(
    fresh_paying_app, sandbox
):
    """The copy has the order at its payment page; the lost machine saw it cancelled, then paid, and
    refunded the money. The copy's re-armed deadline asks the provider, which says paid: the order
    is cancelled and the refund recorded, not Paid with money already given back."""
    from shop.payments.apply import PAID_AFTER_CANCEL

    app = fresh_paying_app
    shopper = Shopper(app, seed_catalog_rows(app))
    assert shopper.checkout("SOCK-M", 1).status_code == 303
    order = shopper.latest()
    sid = order["payment"]["session_id"]
    oid = order_id(app, order["reference"])
    sandbox.set_outcome(sid, "paid")
    _refund_as_the_lost_machine_did(app, order_id=oid, sid=sid, amount=order["total"], reason=PAID_AFTER_CANCEL)

    run_everything(app, utcnow() + timedelta(hours=2))  # past the pay-by: the deadline asks
    seen = shopper.order(order["reference"])
    assert seen["status"] == "Cancelled", seen
    assert [(r["amount"], r["status"]) for r in seen["refunds"]] == [(order["total"], "succeeded")]
    assert _provider_refunds(app, sid) == [(order["total"], "succeeded")]


def test_the_scan_asks_which_payments_of_a_window_are_held_in_one_read_not_one_per_payment(fresh_paying_app, sandbox):
    """In steady state every payment the scan reads is already its order's: which are held is one
    read for the window's payments (in chunks of HELD_CHUNK), not a read per payment (docs/SCALING.md,
    a journey's CPU)."""
    app = fresh_paying_app
    skus = seed_catalog_rows(app)
    _was_sweeping(app)
    for _ in range(12):
        shopper = Shopper(app, skus)
        _order, completed = paid_at_provider(shopper, sandbox)
        assert post_webhook(shopper.client, completed).status_code == 200
    reads: list[str] = []

    def seen(_conn, _cursor, statement, _parameters, _context, _executemany):
        if "payment_session_id" in statement and statement.lstrip().upper().startswith("SELECT"):
            reads.append(statement)

    with app.app_context():
        engine = db.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        result = _sweep(app)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert result.provider.get("paid", 0) == 0 and _unknown(app) == []  # all twelve were their orders' already
    assert len([s for s in reads if "IN (" in s.upper()]) == 1, reads
    assert not [s for s in reads if "payment_session_id =" in s], reads
