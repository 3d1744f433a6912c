"""The checkout queue (payments.checkout_queue), in one process: a checkout the provider's session
budget cannot serve at once places its order in line, the line keeps its customers' order, its
pages say so and go on by themselves, and the queue hands out sessions as the budget allows.
Real database, Redis and sandbox; the queue is served in-process (`serve_now`). Its worker
thread, a killed worker and a wiped Redis are in test_checkout_queue_processes.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from factories import force_order
from payment_helpers import JSON, Shopper, post_webhook, sandbox_event
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order, ScheduledCommand
from shop.outbox import dispatch
from shop.payments import checkout_queue
from shop.payments.start import LINE_HOLD_SECONDS
from shop.provider import guard

QUEUED = {"status": "queued", "session_id": None, "url": None}


# One session a second, and a customer waits no time for the budget: the second checkout within a
# second finds it spent. Every test here runs the shop on a clock it moves by hand (`fake_clock`):
# the budget and the line's hold then move with it, and a loaded machine's slow second (which
# refills Redis's real clock) cannot give a checkout the session the test spent.
ONE_SESSION_A_SECOND = dict(STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=1, STRIPE_CUSTOMER_WAIT_SECONDS=0.0)
SESSIONS = "POST /v1/checkout/sessions"


def _queued(shopper: Shopper) -> dict:
    response = shopper.checkout()
    assert response.status_code == 303, response.get_data(as_text=True)
    order = shopper.latest()
    assert response.headers["Location"].endswith(f"/orders/{order['reference']}")
    assert order["status"] == "PendingPayment" and order["payment"] == QUEUED, order
    return order


def _session_creates(sandbox) -> list[str]:
    """The order ids of the sessions the sandbox created, in the order it received the calls."""
    return [
        c["idempotency_key"].split("-")[2]
        for c in sandbox.requests(method="POST")
        if c["path"] == "/v1/checkout/sessions" and c["status"] == 200
    ]


def test_checkouts_past_the_session_budget_wait_in_line_in_arrival_order_and_each_reaches_its_payment_page(
    make_shop, sandbox, fake_clock
):
    # One provider call at a time (the queue then runs one thread): the budget goes to the line in
    # its order, and with one call in flight the sandbox sees them arrive in that order too. With
    # several, two grants of one refill (the budget runs on Redis's real clock, which a loaded
    # machine lets pass) race to the sandbox, which says nothing of the line.
    app = make_shop(sandbox=True, CLOCK=fake_clock, STRIPE_MAX_CONCURRENT_CALLS=1, **ONE_SESSION_A_SECOND)
    first = Shopper(app)
    assert "/pay/" in first.checkout().headers["Location"]  # the budget's one session this second

    second, third = Shopper(app), Shopper(app)
    second.add("NB-A5-DOT")
    response = second.checkout_cart("bo@example.com", headers=JSON)
    assert response.status_code == 303 and response.get_json()["queued"] is True
    assert response.get_json()["payment_url"] is None
    waiting = second.latest()
    assert waiting["payment"] == QUEUED and waiting["line"]["ahead"] == 0
    page = second.client.get(f"/orders/{waiting['reference']}", headers={"Accept": "text/html"}).get_data(as_text=True)
    assert "you are in line for the payment page" in page and "There is nothing to click" in page
    assert "Pay now" not in page and "data-continue" in page

    # The budget has room again, but the order in line goes first: a later checkout joins behind.
    fake_clock.advance(1.3)
    later = _queued(third)
    assert later["line"]["ahead"] == 1
    assert len(_session_creates(sandbox)) == 1, "a later checkout was served ahead of the line"
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert "shop_payment_queue_orders 2.0" in metrics
    assert "shop_payment_queue_oldest_wait_seconds 0.0" not in metrics  # the first has waited over a second

    with app.app_context():
        assert checkout_queue.serve_now() == 2
    served = [second.order(waiting["reference"]), third.order(later["reference"])]
    assert [o["status"] for o in served] == ["PaymentInitiated"] * 2
    assert all(o["payment"]["status"] == "open" and o["payment"]["url"] and "line" not in o for o in served)
    with app.app_context():
        ids = [
            db.session.execute(select(Order.id).where(Order.reference == o["reference"])).scalar_one() for o in served
        ]
        db.session.remove()
    assert _session_creates(sandbox)[1:] == [str(i) for i in ids], "the line was not served in arrival order"
    # A browser without script reloads to ?continue=1 and is sent on to its payment page.
    onward = second.client.get(f"/orders/{waiting['reference']}?continue=1")
    assert onward.status_code == 303 and onward.headers["Location"] == served[0]["payment"]["url"]

    # Nobody waits any more: the line is open, and a checkout goes straight to its payment page.
    assert "shop_payment_queue_orders 0.0" in app.test_client().get("/metrics").get_data(as_text=True)
    fake_clock.advance(1.3)
    assert "/pay/" in Shopper(app).checkout().headers["Location"]


def test_pay_now_with_the_budget_spent_puts_the_order_in_line_instead_of_refusing(make_shop, sandbox, fake_clock):
    app = make_shop(sandbox=True, CLOCK=fake_clock, **ONE_SESSION_A_SECOND)
    shopper = Shopper(app)
    order = shopper.place()
    sid = order["payment"]["session_id"]
    sandbox.set_outcome(sid, "async_pending")
    sandbox.async_result(sid, "failed")
    post_webhook(shopper.client, sandbox_event(sandbox, "checkout.session.async_payment_failed", sid))
    assert shopper.order(order["reference"])["status"] == "PaymentFailed"
    fake_clock.advance(1.3)  # the budget's second is over

    other = Shopper(app)
    other.checkout()  # spends this second's session
    answer = shopper.pay(order["reference"])
    assert answer.status_code == 202 and answer.get_json()["queued"] is True, answer.get_data(as_text=True)
    assert shopper.order(order["reference"])["payment"] == QUEUED
    with app.app_context():
        assert checkout_queue.serve_now() >= 1
    again = shopper.order(order["reference"])
    assert again["status"] == "PaymentInitiated" and again["payment"]["session_id"] != order["payment"]["session_id"]


def test_the_queue_pauses_while_the_breaker_is_open_and_the_orders_keep_their_place(make_shop, sandbox, fake_clock):
    app = make_shop(sandbox=True, CLOCK=fake_clock, **ONE_SESSION_A_SECOND)
    Shopper(app).checkout()
    waiting = _queued(shopper := Shopper(app))
    with app.app_context():
        provider_guard = guard.get()
        for _ in range(app.config["STRIPE_BREAKER_THRESHOLD"]):
            provider_guard.record(False)
        calls = sandbox.request_count()
        line = checkout_queue.PaymentQueue(app)
        stop = __import__("threading").Event()
        timer = __import__("threading").Timer(1.0, stop.set)
        timer.start()
        assert line.serve(stop) == 0
        assert sandbox.request_count() == calls, "the queue called a provider its breaker had given up on"
        provider_guard.record(True)
        assert checkout_queue.serve_now() == 1
    assert shopper.order(waiting["reference"])["status"] == "PaymentInitiated"


def test_an_order_whose_pay_by_passes_in_line_is_expired_by_its_deadline_like_any_unpaid_order(
    make_shop, sandbox, fake_clock
):
    app = make_shop(sandbox=True, CLOCK=fake_clock, **ONE_SESSION_A_SECOND)
    Shopper(app).checkout()
    waiting = _queued(shopper := Shopper(app))
    window = app.config["UNPAID_ORDER_EXPIRY_SECONDS"]
    with app.app_context():
        order_id = db.session.execute(select(Order.id).where(Order.reference == waiting["reference"])).scalar_one()
        # Its window has run out (placed a window ago) and its deadline is due.
        past = utcnow() - timedelta(seconds=window + 5)
        force_order(order_id, updated_at=past, created_at=past)
        db.session.execute(
            update(ScheduledCommand).where(ScheduledCommand.order_id == order_id).values(next_attempt_at=utcnow())
        )
        db.session.commit()
        assert checkout_queue.serve_now() == 0  # left to its deadline, not given a session
        deadline = db.session.execute(
            select(ScheduledCommand.id).where(
                ScheduledCommand.order_id == order_id, ScheduledCommand.kind == "expire_unpaid_order"
            )
        ).scalar_one()
        dispatch.run_command(deadline)
        row = db.session.get(Order, order_id)
        assert row.status == "Cancelled" and row.payment_queued_at is None
        db.session.remove()
    assert shopper.order(waiting["reference"])["payment"] is None


def test_once_a_process_met_the_line_held_its_next_checkouts_join_it_without_asking_the_provider(
    make_shop, sandbox, fake_clock
):
    app = make_shop(sandbox=True, CLOCK=fake_clock, **ONE_SESSION_A_SECOND)
    Shopper(app).checkout()  # the budget's one session this second
    _queued(Shopper(app))  # refused by the budget: the line forms
    fake_clock.advance(1.3)  # the budget has room again, the line is still held
    _queued(Shopper(app))  # refused because of the line: this process knows now
    with app.app_context(), guard.customer_call():
        assert guard.get().line_seen_held(), "the budget refused the checkout, not the line"
    calls = sandbox.request_count()
    shoppers = [Shopper(app) for _ in range(3)]
    joined = [_queued(shopper) for shopper in shoppers]
    assert sandbox.request_count() == calls, "a checkout asked the provider for a session the line holds back"
    assert [o["line"]["ahead"] for o in joined] == [2, 3, 4]
    with app.app_context():
        assert checkout_queue.serve_now() == 5
    assert [s.order(o["reference"])["status"] for s, o in zip(shoppers, joined, strict=True)] == [
        "PaymentInitiated"
    ] * 3


def test_the_lines_hold_lapses_by_the_clock_the_budget_runs_on_not_by_its_keys_expiry(make_fresh_app, fake_clock):
    # The hold is a time on the budget's own clock (Redis's, or one set by hand), compared with the
    # budget's `now`: with a key that merely expired after the hold on Redis's wall clock, a shop on
    # a hand-set clock would find the line still held after its clock passed the hold, and a test's
    # slow real second could open it under a clock that had not moved.
    app = make_fresh_app(CLOCK=fake_clock)
    with app.app_context(), guard.customer_call():
        provider_guard = guard.get()
        provider_guard.hold_line(LINE_HOLD_SECONDS)
        fake_clock.advance(LINE_HOLD_SECONDS - 0.1)
        with pytest.raises(guard.Shed) as refused:
            provider_guard.take_token(SESSIONS, behind_line=True)
        assert refused.value.kind is guard.ShedKind.LINE
        assert provider_guard.take_token(SESSIONS).endpoint == SESSIONS  # the line holds back new sessions only
        fake_clock.advance(0.2)
        assert provider_guard.take_token(SESSIONS, behind_line=True).endpoint == SESSIONS


def test_a_hold_the_release_before_wrote_still_holds_the_line_until_its_key_expires(make_fresh_app, redis_conn):
    # During a rolling deploy the release before still holds the line its way: the marker 1 in the
    # key, lapsing by the key's own expiry. Read as a time (1 s after 1970) it would be long past,
    # and a new release's checkout would create its session ahead of the orders in line.
    app = make_fresh_app()
    with app.app_context(), guard.customer_call():
        provider_guard = guard.get()
        redis_conn.set(provider_guard.line.key, 1, px=3000)  # exactly what that release's hold wrote
        with pytest.raises(guard.Shed) as refused:
            provider_guard.take_token(SESSIONS, behind_line=True)
        assert refused.value.kind is guard.ShedKind.LINE
        redis_conn.delete(provider_guard.line.key)  # its expiry, come
        assert provider_guard.take_token(SESSIONS, behind_line=True).endpoint == SESSIONS
