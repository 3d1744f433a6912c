"""Late money goes back, once: a payment that completes for an order already Cancelled becomes
one refund record, one refund command and one refund at the provider, however many times the
payment is reported and however often the refund command runs."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from payment_helpers import Shopper, live_shop, order_id, post_webhook, sandbox_event, seed, wait_until
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order, Refund, ScheduledCommand, WebhookReceipt
from shop.outbox.dispatch import run_command
from shop.payments import gateway
from shop.payments.refunds import execute_refund
from shop.payments.service import apply_session, reconcile_order



def _rows(app, model, **filters) -> list:
    with app.app_context():
        rows = db.session.query(model).filter_by(**filters).order_by(model.id).all()
        db.session.expunge_all()
        db.session.remove()
        return rows


def _provider_refunds(app, payment_intent: str) -> list[dict]:
    """What the provider holds, read back through the real SDK (GET /v1/refunds)."""
    with app.app_context():
        page = gateway.client().v1.refunds.list(params={"payment_intent": payment_intent, "limit": 100})
        return [r.to_dict() for r in page.auto_paging_iter()]


def test_a_payment_after_cancellation_is_refunded_exactly_once_however_often_it_is_reported(make_app, sandbox):
    with live_shop(make_app, sandbox) as app:
        shopper = Shopper(app, seed(app))
        order = shopper.place("SOCK-M", 2)
        ref, sid = order["reference"], order["payment"]["session_id"]
        oid = order_id(app, ref)

        # Cancel while the provider is down: the page cannot be retired, the cancel proceeds...
        sandbox.faults(api_unavailable=True)
        assert shopper.cancel(ref, order["version"]).get_json()["status"] == "Cancelled"
        # ...and the customer, still on the open page, pays. Stripe reports it twice.
        sandbox.faults(api_unavailable=False, duplicate_webhooks=True)
        sandbox.set_outcome(sid, "paid")
        wait_until(lambda: len(_rows(app, WebhookReceipt)) >= 2, what="both deliveries")
        # The customer's return and the sweep/console reconcile report it again.
        assert shopper.come_back(ref, sid).status_code == 303
        with app.app_context():
            assert reconcile_order(oid, source="sweep").outcome == "already_refunded"
            db.session.remove()

        assert sorted(r.outcome for r in _rows(app, WebhookReceipt)) == ["accepted", "duplicate"]
        # The cancel could not read the session, so the order was watched for late money; the
        # webhook's refund ends the watch (the sweep will not ask about it again).
        [cancelled] = _rows(app, Order, id=oid)
        assert cancelled.payment_processing_at is None
        [refund] = _rows(app, Refund, order_id=oid)
        assert (refund.session_id, refund.amount, refund.status) == (sid, order["total"], "pending")
        [command] = [c for c in _rows(app, ScheduledCommand, order_id=oid) if c.kind == "refund_payment"]
        assert command.payload == {"refund_id": refund.id}

        # The refund command meets a provider outage first, then goes through.
        sandbox.faults(api_unavailable=True)
        with app.app_context():
            assert run_command(command.id) == "retry"
        assert _rows(app, Refund, order_id=oid)[0].status == "pending"
        sandbox.faults(api_unavailable=False)
        with app.app_context():
            assert run_command(command.id, now=utcnow() + timedelta(seconds=5)) == "done"
            assert run_command(command.id, now=utcnow() + timedelta(seconds=10)) == "skipped"
        [done] = _rows(app, Refund, order_id=oid)
        assert done.status == "succeeded" and done.provider_refund_id
        emails = [c.payload.get("template") for c in _rows(app, ScheduledCommand, order_id=oid)
                  if c.kind == "send_email"]
        assert emails == ["refund_issued"]

        # A worker that died after the provider call but before its commit runs the command
        # again from a pending row: the idempotency key makes the provider answer with the
        # same refund instead of a second one.
        with app.app_context():
            db.session.execute(update(Refund).where(Refund.id == done.id)
                               .values(status="pending", provider_refund_id=None))
            db.session.commit()
            execute_refund(done.id, utcnow())
            db.session.commit()
            again = db.session.get(Refund, done.id)
            assert (again.status, again.provider_refund_id) == ("succeeded", done.provider_refund_id)
            db.session.remove()

        at_provider = _provider_refunds(app, done.payment_intent_id)
        assert [(r["id"], r["amount"], r["status"]) for r in at_provider] == \
            [(done.provider_refund_id, order["total"], "succeeded")]
        final = shopper.order(ref)
        assert final["status"] == "Cancelled"
        assert final["refunds"] == [{"id": done.id, "amount": order["total"], "status": "succeeded"}]


def test_a_second_paid_session_for_an_already_paid_order_is_refunded(paying_app, sandbox):
    shopper = Shopper(paying_app, seed(paying_app))
    order = shopper.place()
    ref, first = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(first, "paid")
    post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", first))
    assert shopper.order(ref)["status"] == "Paid"

    # Another session for the same order (say, a second tab from an earlier attempt) is paid too.
    oid = order_id(paying_app, ref)
    with paying_app.app_context():

        o = db.session.get(Order, oid)
        other = gateway.create_checkout_session(
            order_id=oid, reference=ref, attempt=9, lines=list(o.lines), currency=o.currency, email=o.email,
            success_url="http://shop.test/ok", cancel_url="http://shop.test/no",
            expires_at=utcnow() + timedelta(hours=1))
        db.session.remove()
    sandbox.set_outcome(other.id, "paid")
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", other.id))
    assert r.get_json()["outcome"] == "refund_created"
    with paying_app.app_context():  # the same notice through another path refunds nothing more
        assert apply_session(gateway.retrieve_session(other.id), source="console").outcome == "already_refunded"
        db.session.remove()

    assert shopper.order(ref)["status"] == "Paid"
    [refund] = _rows(paying_app, Refund, order_id=oid)
    assert refund.session_id == other.id and "paid twice" in refund.reason


def _cancel_while_settling(shopper, sandbox):
    """A customer pays by a method that settles later, then cancels before it settles: the cancel
    goes through (nothing is paid yet) and the order is marked as one money may still come for."""
    order = shopper.place("SOCK-M", 1)
    ref, sid = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(sid, "async_pending")
    r = shopper.cancel(ref, order["version"])
    assert r.status_code == 200 and r.get_json()["status"] == "Cancelled", r.get_json()
    return order, ref, sid


def test_money_that_settles_after_a_cancel_is_refunded_by_the_sweep_when_its_webhook_is_lost(paying_app, sandbox):
    """No webhook reaches this app (no endpoint is registered): only the sweep can notice the
    money. Without its watch on cancelled orders the payment is kept and nothing flags it."""
    from shop.scheduling.sweep import run_cycle

    shopper = Shopper(paying_app, seed(paying_app))
    order, ref, sid = _cancel_while_settling(shopper, sandbox)
    oid = order_id(paying_app, ref)
    sandbox.async_result(sid, "succeeded")  # the bank settles; the webhook is lost

    with paying_app.app_context():
        first = run_cycle()
        assert first.provider["late_refund"] == 1, first.summary()
        again = run_cycle()
        assert again.provider["late_refund"] == 0 and again.provider["watch_closed"] == 0  # no longer watched
        db.session.remove()
    [refund] = _rows(paying_app, Refund, order_id=oid)
    assert (refund.session_id, refund.amount) == (sid, order["total"])
    [command] = [c for c in _rows(paying_app, ScheduledCommand, order_id=oid) if c.kind == "refund_payment"]
    with paying_app.app_context():
        assert run_command(command.id) == "done"
    [done] = _rows(paying_app, Refund, order_id=oid)
    assert [(r["amount"], r["status"]) for r in _provider_refunds(paying_app, done.payment_intent_id)] == \
        [(order["total"], "succeeded")]
    assert shopper.order(ref)["status"] == "Cancelled"


def test_a_settling_payment_that_fails_after_a_cancel_ends_the_watch_without_a_refund(paying_app, sandbox):
    from shop.scheduling.sweep import run_cycle

    shopper = Shopper(paying_app, seed(paying_app))
    order, ref, sid = _cancel_while_settling(shopper, sandbox)
    oid = order_id(paying_app, ref)
    with paying_app.app_context():
        assert run_cycle().provider["awaiting_async"] == 1  # still settling: asked again after a backoff
        db.session.remove()
    sandbox.async_result(sid, "failed")
    with paying_app.app_context():

        db.session.execute(update(Order).where(Order.id == oid).values(provider_next_check_at=None))
        db.session.commit()  # as if the backoff had passed
        assert run_cycle().provider["watch_closed"] == 1
        assert db.session.get(Order, oid).payment_processing_at is None
        db.session.remove()
    assert _rows(paying_app, Refund, order_id=oid) == []


def test_with_a_short_payment_window_the_late_money_watch_asks_again_within_that_window(make_app, sandbox):
    """Between questions about a cancelled order whose payment is still settling, the watch backs
    off. Five minutes suits the default 30-minute window; with a short one (a demo, the chaos
    run) the refund for a lost late-payment webhook must not wait longer than the window."""
    from shop.scheduling.sweep import run_cycle

    app = make_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60,
                   STRIPE_WEBHOOK_SECRET="whsec_test_secret", UNPAID_ORDER_EXPIRY_SECONDS=60,
                   RECONCILIATION_STUCK_AGE_SECONDS=60, RECONCILIATION_INTERVAL_SECONDS=5)
    shopper = Shopper(app, seed(app))
    order, ref, sid = _cancel_while_settling(shopper, sandbox)
    oid = order_id(app, ref)
    start = utcnow()
    with app.app_context():
        assert run_cycle(now=start).provider["awaiting_async"] == 1  # still settling: ask again later
        db.session.remove()
    sandbox.async_result(sid, "succeeded")  # the bank settles; the webhook is lost

    with app.app_context():
        assert run_cycle(now=start + timedelta(seconds=30)).provider["late_refund"] == 0  # backed off
        assert run_cycle(now=start + timedelta(seconds=61)).provider["late_refund"] == 1
        db.session.remove()
    [refund] = _rows(app, Refund, order_id=oid)
    assert (refund.session_id, refund.amount) == (sid, order["total"])
