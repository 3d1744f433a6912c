"""Paying for an order through the real stripe SDK against the sandbox (a real HTTP server):
the happy path end to end, declines, async payments, expiry and retry, a lost webhook made
good by the customer's return, checkout while the provider is down, cancelling around the
hosted page, and the gateway's idempotency and error handling."""

from __future__ import annotations

import logging

import pytest
import stripe

from factories import on_hand, seed_catalog_rows
from payment_helpers import Shopper, live_shop, order_id, post_webhook, sandbox_event, wait_for_status
from shop.extensions import db
from shop.models import Order, OutboxDelivery, OutboxEvent, ScheduledCommand, WebhookReceipt
from shop.outbox.dispatch import run_delivery
from shop.payments.apply import reconcile_order
from shop.provider import gateway
from shop.stripe_sandbox.testing import SandboxControlError
from support import rows_in


def _event_names(app, ref) -> list[str]:
    return [e.name for e in rows_in(app, OutboxEvent, order_id=order_id(app, ref))]


def _provider_session(app, session_id) -> gateway.SessionView:
    with app.app_context():
        return gateway.retrieve_session(session_id)


# -- end to end: the sandbox delivers to the shop over HTTP ------------------------------------


def test_paying_on_the_hosted_page_makes_the_order_paid_through_the_registered_webhook(make_fresh_app, sandbox):
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        order = shopper.place()
        sandbox.set_outcome(order["payment"]["session_id"], "paid")

        paid = wait_for_status(shopper, order["reference"], "Paid")
        assert paid["payment"]["status"] == "paid"
        [event] = sandbox.wait_for_event("checkout.session.completed")
        assert [d["status"] for d in event["deliveries"]] == ["succeeded"]
        assert [(r.event_id, r.outcome) for r in rows_in(app, WebhookReceipt)] == [(event["id"], "accepted")]
        assert _event_names(app, order["reference"]).count("OrderPaid") == 1
        assert [
            d.handler
            for d in rows_in(app, OutboxDelivery, order_id=order_id(app, order["reference"]))
            if d.handler == "send_order_confirmation"
        ]


def test_a_dropped_webhook_is_made_good_by_the_customers_return(make_fresh_app, sandbox):
    with live_shop(make_fresh_app, sandbox) as app:
        shopper = Shopper(app, seed_catalog_rows(app))
        order = shopper.place()
        sid = order["payment"]["session_id"]
        sandbox.faults(drop_webhooks=1)
        sandbox.set_outcome(sid, "paid")

        [record] = sandbox.events("checkout.session.completed")
        assert record["dropped"] and {d["status"] for d in record["deliveries"]} == {"dropped"}
        assert shopper.order(order["reference"])["status"] == "PaymentInitiated"

        back = shopper.come_back(order["reference"], sid)
        assert back.status_code == 303
        assert back.headers["Location"].endswith(f"/orders/{order['reference']}")
        assert shopper.order(order["reference"])["status"] == "Paid"
        assert rows_in(app, WebhookReceipt) == []  # nothing came in by webhook: the return did it


# -- outcomes at the provider, delivered as signed posts ---------------------------------------


def test_a_declined_card_leaves_the_order_payable_on_the_same_session(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    sid = order["payment"]["session_id"]
    sandbox.set_outcome(sid, "declined")

    # Stripe tells only of the failed attempt; the customer stays on the page, its session open.
    assert [e["type"] for e in sandbox.events()] == ["payment_intent.payment_failed"]
    with fresh_paying_app.app_context():
        assert reconcile_order(order_id(fresh_paying_app, order["reference"])).outcome == "noop"
    assert _provider_session(fresh_paying_app, sid).status == "open"
    after = shopper.order(order["reference"])
    assert (after["status"], after["version"]) == ("PaymentInitiated", order["version"])

    sandbox.set_outcome(sid, "paid")  # a second card on the same page
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", sid))
    assert r.get_json()["outcome"] == "paid"
    assert shopper.order(order["reference"])["status"] == "Paid"


def test_an_async_payment_that_succeeds_later_pays_the_order(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    sid = order["payment"]["session_id"]
    sandbox.set_outcome(sid, "async_pending")
    completed = sandbox_event(sandbox, "checkout.session.completed", sid)
    assert completed["data"]["object"]["payment_status"] == "unpaid"

    r = post_webhook(shopper.client, completed)
    assert r.get_json()["outcome"] == "awaiting_async"
    waiting = shopper.order(order["reference"])
    # Checkout is finished; the bank settles later. Not a state change (same version), but the
    # customer is told so and not sent back to the payment page.
    assert (waiting["status"], waiting["version"]) == ("PaymentInitiated", order["version"])
    assert waiting["payment"]["status"] == "processing"
    page = shopper.client.get(f"/orders/{order['reference']}").get_data(as_text=True)
    assert "being processed" in page and "Continue to payment" not in page
    assert post_webhook(shopper.client, completed).get_json()["outcome"] == "duplicate"

    sandbox.async_result(sid, "succeeded")
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.async_payment_succeeded", sid))
    assert (r.status_code, r.get_json()["outcome"]) == (200, "paid")
    assert shopper.order(order["reference"])["status"] == "Paid"
    [paid] = rows_in(fresh_paying_app, Order, reference=order["reference"])
    assert paid.payment_processing_at is None  # settled: the "money may still come" mark is gone


def test_an_async_payment_that_fails_notifies_the_customer_and_rearms_the_deadline(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    sid = order["payment"]["session_id"]
    ref = order["reference"]
    sandbox.set_outcome(sid, "async_pending")
    post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", sid))
    sandbox.async_result(sid, "failed")
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.async_payment_failed", sid))
    assert (r.status_code, r.get_json()["outcome"]) == (200, "payment_failed")
    assert shopper.order(ref)["status"] == "PaymentFailed"

    oid = order_id(fresh_paying_app, ref)
    [followup] = [
        d for d in rows_in(fresh_paying_app, OutboxDelivery, order_id=oid) if d.handler == "payment_failed_followups"
    ]
    with fresh_paying_app.app_context():
        assert run_delivery(followup.id) == "done"
    commands = rows_in(fresh_paying_app, ScheduledCommand, order_id=oid)
    emails = [c for c in commands if c.kind == "send_email"]
    assert [c.payload["template"] for c in emails] == ["payment_failed"]
    deadlines = [c for c in commands if c.kind == "expire_unpaid_order"]
    assert len(deadlines) == 2 and deadlines[1].next_attempt_at > deadlines[0].next_attempt_at

    again = shopper.pay(ref)  # the failed order is payable again
    assert again.status_code == 200 and again.get_json()["payment_url"]
    assert shopper.order(ref)["payment"]["status"] == "open"  # a new session: nothing is processing now


def test_an_expired_session_fails_the_payment_and_the_customer_can_pay_again(make_fresh_app, sandbox):
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_WEBHOOK_SECRET="whsec_test_secret",
        UNPAID_ORDER_EXPIRY_SECONDS=60,
        RECONCILIATION_STUCK_AGE_SECONDS=60,
        STRIPE_SESSION_MIN_SECONDS=60,
    )
    shopper = Shopper(app, seed_catalog_rows(app))
    order = shopper.place()
    ref, first = order["reference"], order["payment"]["session_id"]

    sandbox.advance_clock(200)  # past expires_at: the sandbox expires the session by itself
    expired = sandbox_event(sandbox, "checkout.session.expired", first)
    r = post_webhook(shopper.client, expired)
    assert (r.status_code, r.get_json()["outcome"]) == (200, "payment_failed")
    failed = shopper.order(ref)
    assert failed["status"] == "PaymentFailed"

    # The sandbox clock now runs 200 s ahead of the shop's; a new session must outlive that gap.
    app.config["STRIPE_SESSION_MIN_SECONDS"] = 600
    r = shopper.pay(ref)
    assert r.status_code == 200, r.get_data(as_text=True)
    again = shopper.order(ref)
    second = again["payment"]["session_id"]
    assert again["status"] == "PaymentInitiated" and second != first
    assert r.get_json()["payment_url"] == again["payment"]["url"]
    oid = order_id(app, ref)
    with sandbox.sandbox.lock:
        keys = sorted(k for (_api_key, k) in sandbox.sandbox.idempotency if k.startswith(f"backstop-order-{oid}-"))
    assert [k.split("-until-")[0] for k in keys] == [
        f"backstop-order-{oid}-session-attempt-1",
        f"backstop-order-{oid}-session-attempt-2",
    ]

    sandbox.set_outcome(second, "paid")
    post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", second))
    assert shopper.order(ref)["status"] == "Paid"


# -- checkout while the provider is down --------------------------------------------------------


def test_checkout_with_the_provider_down_lands_on_a_payable_order_page(fresh_paying_app, shopper, sandbox):
    sandbox.faults(api_unavailable=True)
    r = shopper.checkout("MUG-350-SND", 2)
    assert r.status_code == 303
    ref = r.headers["Location"].rsplit("/", 1)[-1]
    assert r.headers["Location"].endswith(f"/orders/{ref}")

    order = shopper.order(ref)
    assert order["status"] == "PendingPayment" and order["payment"] is None and order["pay_by"]
    # Its deadline, and its payment link's email for when payments work again
    # (tests/payments/test_payment_link_email.py).
    assert [c.kind for c in rows_in(fresh_paying_app, ScheduledCommand, order_id=order_id(fresh_paying_app, ref))] == [
        "expire_unpaid_order",
        "offer_payment_link",
    ]
    assert on_hand(shopper.skus["MUG-350-SND"], fresh_paying_app) == 10  # the items are held
    page = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "Pay now" in page and "could not reach the payment provider" in page

    still_down = shopper.pay(ref)
    assert still_down.status_code == 503 and "could not reach" in still_down.get_json()["error"]
    sandbox.faults(api_unavailable=False)
    r = shopper.pay(ref)
    assert r.status_code == 200
    assert shopper.order(ref)["status"] == "PaymentInitiated"


# -- cancelling around the hosted page ----------------------------------------------------------


def test_cancel_is_refused_while_the_session_is_paid_at_the_provider(fresh_paying_app, shopper, sandbox):
    order = shopper.place("NB-A6-DOT", 2)
    ref, sid = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(sid, "paid")  # and the webhook has not arrived yet
    stock = on_hand(shopper.skus["NB-A6-DOT"], fresh_paying_app)

    r = shopper.cancel(ref, order["version"])
    assert r.status_code == 409
    assert "already been paid" in r.get_json()["error"]
    after = shopper.order(ref)
    assert (after["status"], after["version"]) == ("PaymentInitiated", order["version"])
    assert "OrderCancelled" not in _event_names(fresh_paying_app, ref)
    assert on_hand(shopper.skus["NB-A6-DOT"], fresh_paying_app) == stock
    assert _provider_session(fresh_paying_app, sid).payment_status == "paid"

    post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.completed", sid))
    assert shopper.order(ref)["status"] == "Paid"  # the payment stands


def test_cancelling_an_unpaid_order_expires_its_session_at_the_provider_first(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    ref, sid = order["reference"], order["payment"]["session_id"]

    r = shopper.cancel(ref, order["version"])
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json()["status"] == "Cancelled"
    assert _provider_session(fresh_paying_app, sid).status == "expired"
    with pytest.raises(SandboxControlError):
        sandbox.set_outcome(sid, "paid")  # nobody can pay the retired page any more

    # The expiry notice the retirement caused arrives afterwards and changes nothing.
    r = post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.expired", sid))
    assert r.status_code == 200
    assert shopper.order(ref)["status"] == "Cancelled"


def test_cancel_with_the_provider_down_proceeds_with_a_warning(fresh_paying_app, shopper, sandbox, caplog):
    order = shopper.place()
    sandbox.faults(api_unavailable=True)
    with caplog.at_level(logging.WARNING):
        r = shopper.cancel(order["reference"], order["version"])
    assert r.status_code == 200 and r.get_json()["status"] == "Cancelled"
    assert any(rec.levelno == logging.WARNING and "cancelling anyway" in rec.getMessage() for rec in caplog.records)
    sandbox.faults(api_unavailable=False)
    assert _provider_session(fresh_paying_app, order["payment"]["session_id"]).status == "open"


# -- the gateway against Stripe's wire behaviour ------------------------------------------------


def _session_args(app, ref, attempt=1) -> dict:
    from datetime import datetime, timedelta, timezone

    from shop.models import Order

    order = db.session.query(Order).filter_by(reference=ref).one()
    return dict(
        order_id=order.id,
        reference=ref,
        attempt=attempt,
        lines=list(order.lines),
        currency=order.currency,
        email=order.email,
        success_url="http://shop.test/ok",
        cancel_url="http://shop.test/no",
        expires_at=datetime.now(timezone.utc) + timedelta(hours=1),
    )


def test_a_repeated_session_request_for_the_same_attempt_is_replayed_not_duplicated(fresh_paying_app, shopper, sandbox):
    sandbox.faults(api_unavailable=True)
    ref = shopper.buy()  # an order with no session yet
    sandbox.faults(api_unavailable=False)
    with fresh_paying_app.app_context():
        args = _session_args(fresh_paying_app, ref)
        first = gateway.create_checkout_session(**args)
        replay = gateway.create_checkout_session(**args)
        assert replay.id == first.id and replay.url == first.url
        next_attempt = gateway.create_checkout_session(**{**args, "attempt": 2})
        assert next_attempt.id != first.id
        # the same key with other parameters is Stripe's idempotency_error, not a new session
        with pytest.raises(gateway.ProviderRefused) as refused:
            gateway.create_checkout_session(**{**args, "email": "someone@else.example"})
        assert isinstance(refused.value.__cause__, stripe.IdempotencyError)
        db.session.remove()
    with sandbox.sandbox.lock:
        assert len(sandbox.sandbox.sessions) == 2


def test_provider_errors_arrive_as_stripes_own_exceptions_and_are_classified(fresh_paying_app, sandbox):
    with fresh_paying_app.app_context():
        sdk = gateway.client()
        with pytest.raises(stripe.InvalidRequestError) as missing:
            sdk.v1.checkout.sessions.retrieve("cs_test_nope")
        assert missing.value.http_status == 404
        assert missing.value.code == "resource_missing"
        assert missing.value.error.type == "invalid_request_error" and missing.value.error.param == "id"
        with pytest.raises(gateway.ProviderRefused):
            gateway.retrieve_session("cs_test_nope")

        sandbox.faults(api_unavailable=True)
        with pytest.raises(stripe.APIError) as down:
            sdk.v1.checkout.sessions.retrieve("cs_test_nope")
        assert down.value.http_status == 503 and down.value.error.type == "api_error"
        with pytest.raises(gateway.ProviderUnavailable):
            gateway.retrieve_session("cs_test_nope")


def test_a_second_device_returning_with_the_orders_own_session_gets_its_page_even_with_the_provider_down(
    fresh_paying_app, shopper, sandbox
):
    """The customer paid on their phone: the success URL carries the session the order recorded,
    which proves as much as the provider's answer would. A different session id proves nothing."""
    order = shopper.place()
    sid = order["payment"]["session_id"]
    sandbox.faults(api_unavailable=True)
    phone = fresh_paying_app.test_client()
    assert phone.get(f"/checkout/return?order={order['reference']}&session_id=cs_test_other").status_code == 404
    back = phone.get(f"/checkout/return?order={order['reference']}&session_id={sid}")
    assert back.status_code == 303 and "token=" in back.headers["Location"]
    seen = phone.get(back.headers["Location"], headers={"Accept": "application/json"})
    assert seen.status_code == 200 and seen.get_json()["reference"] == order["reference"]


def test_pay_now_starts_a_payment_after_the_first_attempts_save_was_lost(
    make_fresh_app, sandbox, monkeypatch, fake_clock
):
    """The session was created at the provider but the order's update was lost (its database
    connection died): the order stays PendingPayment with no attempt counted. "Pay now" asks for
    the same attempt with a later expires_at; under a key naming the attempt alone the provider
    refused it as a reused key with other parameters, every time, until the deadline."""
    from sqlalchemy.exc import OperationalError

    from shop.outbox import uow

    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_SESSION_MIN_SECONDS=60,
        STRIPE_WEBHOOK_SECRET="whsec_test_secret",
        UNPAID_ORDER_EXPIRY_SECONDS=60,
        RECONCILIATION_STUCK_AGE_SECONDS=60,
        CLOCK=fake_clock,
    )
    shopper = Shopper(app, seed_catalog_rows(app))
    real_commit, real_create, lost = uow.commit, gateway.create_checkout_session, []
    fake_clock.catch_up(0.5)  # never behind the sandbox's clock, which checks a session's minimum life

    def create_then_lose_the_save(**kwargs):
        lost.append("armed")  # the commit after the first session's creation is the one lost
        return real_create(**kwargs)

    def commit_lost_once(session):
        if lost == ["armed"]:
            lost.append(True)
            raise OperationalError("UPDATE orders ...", {}, Exception("server closed the connection unexpectedly"))
        real_commit(session)

    monkeypatch.setattr(uow, "commit", commit_lost_once)
    monkeypatch.setattr(gateway, "create_checkout_session", create_then_lose_the_save)
    r = shopper.checkout()
    assert r.status_code == 303 and "/orders/" in r.headers["Location"]  # the order stands; "Pay now"
    ref = r.headers["Location"].rsplit("/", 1)[-1]
    assert shopper.order(ref)["status"] == "PendingPayment"
    assert len(sandbox.sandbox.sessions) == 1  # created, never recorded

    fake_clock.advance(1.1)  # the session's end, now + minimum, moves on by a second
    r = shopper.pay(ref)

    assert r.status_code == 200, r.get_data(as_text=True)
    order = shopper.order(ref)
    assert order["status"] == "PaymentInitiated" and order["payment"]["url"] == r.get_json()["payment_url"]


def test_two_clicks_on_pay_now_at_once_leave_the_winners_session_open(
    fresh_paying_app, shopper, sandbox, monkeypatch, fake_clock
):
    """Both starts of the same attempt get the same session from the provider (one key); the one
    that loses the version check must not expire it, since it is the session the winner recorded.
    "At once" is one moment of the shop's clock: the key names the session's end, which for an
    order's first session is now + its window, so on a loaded machine two clicks a second apart
    asked for two sessions (and the loser rightly expired its own)."""
    import threading

    from shop import clock
    from shop.payments.start import start_payment

    clock.use(fake_clock)  # the test's apps read the process's clock; conftest puts the system's back

    sandbox.faults(api_unavailable=True)
    ref = shopper.buy()
    sandbox.faults(api_unavailable=False)
    oid = order_id(fresh_paying_app, ref)
    real, nested = gateway.create_checkout_session, []

    def create_then_let_the_other_click_win(**kwargs):
        view = real(**kwargs)
        if not nested:
            nested.append(True)

            def other_click():
                with fresh_paying_app.app_context():
                    assert start_payment(oid).status == "started"
                    db.session.remove()

            thread = threading.Thread(target=other_click)
            thread.start()
            thread.join(timeout=30)
        return view

    monkeypatch.setattr(gateway, "create_checkout_session", create_then_let_the_other_click_win)
    with fresh_paying_app.app_context():
        lost = start_payment(oid)  # lost the race, to a start of the very same session
        assert (lost.status, lost.url) == ("started", shopper.order(ref)["payment"]["url"])
        db.session.remove()

    order = shopper.order(ref)
    assert order["status"] == "PaymentInitiated"
    assert _provider_session(fresh_paying_app, order["payment"]["session_id"]).status == "open"
