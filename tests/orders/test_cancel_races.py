"""A customer's cancel at the hosted page against the provider's notice of the expiry that cancel
itself causes: whichever of the two commits first, the cancel the customer was entitled to
succeeds, the stock comes back once, and no "your payment did not go through" email goes out.

The interleaving the chaos run met by chance (about 1 cancel in 700) is forced here: the
gateway's expire call is wrapped so that, after the real call to the sandbox, the notice is
applied before the cancel gets to commit."""

from __future__ import annotations

import os
import threading

from factories import on_hand, seed_catalog_rows
from payment_helpers import Shopper, live_shop, order_id
from shop.extensions import db
from shop.models import Order, OutboxEvent, ScheduledCommand
from shop.outbox.dispatch import drain_deliveries, run_command
from shop.payments.apply import reconcile_order
from shop.provider import gateway


def _names(app, ref) -> list[str]:
    with app.app_context():
        oid = order_id(app, ref)
        names = [e.name for e in db.session.query(OutboxEvent).filter_by(order_id=oid).order_by(OutboxEvent.id)]
        db.session.remove()
        return names


def _settle(app) -> None:
    """Run every delivery and every due command, as the workers would."""
    with app.app_context():
        drain_deliveries()
        due = [
            c.id
            for c in db.session.query(ScheduledCommand).filter_by(status="pending")
            if c.kind != "expire_unpaid_order"
        ]
        for command_id in due:
            run_command(command_id)
        drain_deliveries()
        db.session.remove()


def _expire_then(monkeypatch, after) -> None:
    real = gateway.expire_session

    def expire_then_notice(session_id, **kwargs):
        view = real(session_id, **kwargs)
        after(session_id)
        return view

    monkeypatch.setattr(gateway, "expire_session", expire_then_notice)


def _mails(app, ref: str) -> list[str]:
    """The messages the file outbox holds for one order (its key names the order's reference and the email)."""
    folder = os.path.join(app.instance_path, "mail")
    return sorted(f for f in (os.listdir(folder) if os.path.isdir(folder) else []) if f.startswith(f"{ref}-"))


def test_a_cancel_whose_own_expiry_notice_lands_first_still_cancels_the_order(
    make_fresh_app, sandbox, monkeypatch, tmp_path
):
    with live_shop(make_fresh_app, sandbox) as app:
        app.instance_path = str(tmp_path)  # this test's mail in a folder of its own
        shopper = Shopper(app, seed_catalog_rows(app))
        variant = shopper.skus["NB-A6-DOT"]
        stock = on_hand(variant, app)
        order = shopper.place("NB-A6-DOT", 2)
        ref = order["reference"]
        # The sandbox delivers the checkout.session.expired event to the shop over HTTP, and the
        # shop applies it, before the cancel's own transaction commits.
        _expire_then(monkeypatch, lambda sid: sandbox.wait_for_event("checkout.session.expired"))

        r = shopper.cancel(ref, order["version"])

        assert r.status_code == 200, r.get_data(as_text=True)
        assert r.get_json()["status"] == "Cancelled"
        [event] = sandbox.events("checkout.session.expired")
        assert event["event"]["request"]["idempotency_key"].startswith(gateway.CANCEL_EXPIRY_KEY_PREFIX)
        assert "OrderPaymentFailed" not in _names(app, ref)
        assert _names(app, ref).count("OrderCancelled") == 1
        _settle(app)
        assert on_hand(variant, app) == stock
        with app.app_context():
            assert db.session.query(Order).filter_by(reference=ref).one().inventory_restored
            assert not db.session.query(ScheduledCommand).filter_by(kind="send_email").all()  # never "payment failed"
            db.session.remove()
        assert _mails(app, ref) == [f"{ref}-order_cancelled-event.eml"]


def test_a_cancel_survives_its_expiry_being_applied_as_a_failed_payment_by_another_path(
    fresh_paying_app, sandbox, monkeypatch, tmp_path
):
    fresh_paying_app.instance_path = str(tmp_path)  # this test's mail in a folder of its own
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    variant = shopper.skus["NB-A6-DOT"]
    stock = on_hand(variant, fresh_paying_app)
    order = shopper.place("NB-A6-DOT", 1)
    ref, oid = order["reference"], order_id(fresh_paying_app, order["reference"])

    def operator_reconciles(_sid):
        # An operator's "ask the provider now" (or the sweep) reads the session the cancel just
        # expired; nothing in that answer says who expired it, so it is an early expiry there.
        def reconcile():
            with fresh_paying_app.app_context():
                assert reconcile_order(oid, source="console").outcome == "payment_failed"
                db.session.remove()

        thread = threading.Thread(target=reconcile)
        thread.start()
        thread.join(timeout=10)

    _expire_then(monkeypatch, operator_reconciles)

    r = shopper.cancel(ref, order["version"])

    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json()["status"] == "Cancelled"
    assert _names(fresh_paying_app, ref) == ["OrderPlaced", "PaymentInitiated", "OrderPaymentFailed", "OrderCancelled"]
    _settle(fresh_paying_app)
    assert on_hand(variant, fresh_paying_app) == stock
    with fresh_paying_app.app_context():
        emails = db.session.query(ScheduledCommand).filter_by(kind="send_email").order_by(ScheduledCommand.id).all()
        # The failed-payment email was queued by the follow-up but not sent: the order had moved on.
        assert [(c.payload["template"], c.status) for c in emails] == [("payment_failed", "done")]
        db.session.remove()
    assert _mails(fresh_paying_app, ref) == [f"{ref}-order_cancelled-event.eml"]


def test_a_stale_cancel_is_still_refused_without_touching_the_provider(fresh_paying_app, sandbox):
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    order = shopper.place("NB-A6-DOT", 1)
    r = shopper.cancel(order["reference"], order["version"] - 1)
    assert r.status_code == 409
    assert not sandbox.events("checkout.session.expired")
    assert shopper.order(order["reference"])["status"] == "PaymentInitiated"
