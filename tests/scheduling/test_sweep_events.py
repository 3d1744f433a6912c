"""The sweep's provider pass when many orders are in doubt at once (scheduling.sweep,
`settle_from_events`): it learns their sessions' states from the provider's event list, a
hundred events a call, instead of one retrieve per order; with few in doubt, or with orders
older than the provider keeps events, it asks order by order as before. Real database, Redis and
sandbox (its request log counts the calls); no webhook reaches the shop in these tests, as after
an outage of its endpoint."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import select

from factories import catalog_rows, place_order_for
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order
from shop.payments.start import start_payment
from shop.scheduling import sweep
from shop.scheduling.passes.in_doubt import EVENTS_KEPT
from shop.scheduling.sweep import run_cycle


def _at_the_payment_page(count: int) -> list[tuple[int, str]]:
    """`count` orders waiting at their hosted payment page: (order id, session id)."""
    [variant] = catalog_rows(count + 10)
    started = []
    for _ in range(count):
        placed = place_order_for({variant: 1})
        assert start_payment(placed.order_id, placed=placed).status == "started"
        started.append(placed.order_id)
    rows = dict(db.session.execute(select(Order.id, Order.payment_session_id).where(Order.id.in_(started))).all())
    db.session.rollback()
    return [(order_id, rows[order_id]) for order_id in started]


def _statuses(ids) -> dict[str, int]:
    found: dict[str, int] = {}
    for status in db.session.execute(select(Order.status).where(Order.id.in_(ids))).scalars():
        found[status] = found.get(status, 0) + 1
    db.session.rollback()
    return found


def _calls(sandbox, since: float) -> dict[str, int]:
    counted: dict[str, int] = {}
    for call in sandbox.requests(since=since):
        counted[call["endpoint"]] = counted.get(call["endpoint"], 0) + 1
    return counted


def _a_window_later():
    return utcnow() + timedelta(seconds=1800 + 60)  # every order placed now is stuck by then


def test_after_a_webhook_outage_one_cycle_settles_200_orders_from_the_event_list_in_at_most_10_calls(
    fresh_paying_app, sandbox
):
    with fresh_paying_app.app_context():
        orders = _at_the_payment_page(200)
        paid, async_failed, still_open = orders[:160], orders[160:180], orders[180:]
        for _, sid in paid:
            sandbox.set_outcome(sid, "paid")
        for _, sid in async_failed:  # completed, then the bank said no: two events, the latest wins
            sandbox.set_outcome(sid, "async_pending")
            sandbox.async_result(sid, "failed")
        since = time.time()

        result = run_cycle(now=_a_window_later())

        calls = _calls(sandbox, since)
        assert result.status == "ok", result.errors
        assert sum(calls.values()) <= 10, calls
        # The event pages, and one list of the refunds since (a restored copy's check that no paid
        # session was given back already): nothing asked order by order.
        assert set(calls) == {"GET /v1/events", "GET /v1/refunds"}, f"asked order by order: {calls}"
        assert calls["GET /v1/refunds"] == 1, calls
        assert result.provider["event_pages"] == calls["GET /v1/events"]
        assert _statuses(i for i, _ in paid) == {"Paid": 160}
        assert _statuses(i for i, _ in async_failed) == {"PaymentFailed": 20}
        assert _statuses(i for i, _ in still_open) == {"PaymentInitiated": 20}
        assert (result.provider["paid"], result.provider["payment_failed"], result.provider["open"]) == (160, 20, 20)
        db.session.remove()


def test_with_few_orders_in_doubt_the_sweep_asks_order_by_order_as_before(fresh_paying_app, sandbox):
    with fresh_paying_app.app_context():
        orders = _at_the_payment_page(sweep.BULK_THRESHOLD - 1)
        for _, sid in orders[:5]:
            sandbox.set_outcome(sid, "paid")
        since = time.time()

        result = run_cycle(now=_a_window_later())

        calls = _calls(sandbox, since)
        assert calls == {"GET /v1/checkout/sessions/{id}": len(orders)}, calls
        assert result.provider["paid"] == 5 and "event_pages" not in result.provider
        db.session.remove()


def test_orders_older_than_the_providers_event_retention_are_asked_about_one_by_one(fresh_paying_app, sandbox):
    with fresh_paying_app.app_context():
        orders = _at_the_payment_page(sweep.BULK_THRESHOLD + 5)
        for _, sid in orders:
            sandbox.set_outcome(sid, "paid")
        since = time.time()

        # A month on, their events are gone from the provider's list: the retrieve still knows.
        result = run_cycle(now=utcnow() + EVENTS_KEPT + timedelta(days=1))
        assert result.status == "ok" and "event_pages" not in result.provider

        calls = _calls(sandbox, since)
        assert calls == {"GET /v1/checkout/sessions/{id}": len(orders)}, calls
        assert _statuses(i for i, _ in orders) == {"Paid": len(orders)}
        db.session.remove()


def test_a_paid_session_the_replaced_machine_refunded_as_late_money_is_not_taken_as_payment_in_bulk(
    fresh_paying_app, sandbox
):
    """A restored copy's orders in doubt, settled from the event list: one session's payment was
    given back as late money by the machine the copy replaces (the copy never saw the cancel). The
    event still says paid; the refunds listed beside the events say it went back, so the copy
    cancels that order as the other machine had (its stock back through the compensation) instead
    of keeping the money as payment."""
    from shop.payments.apply import PAID_AFTER_CANCEL
    from shop.provider import gateway

    with fresh_paying_app.app_context():
        orders = _at_the_payment_page(20)
        for _, sid in orders:
            sandbox.set_outcome(sid, "paid")
        refunded_id, refunded_sid = orders[0]
        view = gateway.retrieve_session(refunded_sid)
        assert view.payment_intent and view.amount_total
        gateway.create_refund(
            order_id=refunded_id,
            session_id=refunded_sid,
            payment_intent=view.payment_intent,
            amount=view.amount_total,
            reason=PAID_AFTER_CANCEL,
        )
        since = time.time()

        result = run_cycle(now=_a_window_later())

        assert result.status == "ok", result.errors
        assert "GET /v1/checkout/sessions/{id}" not in _calls(sandbox, since)  # still settled in bulk
        assert _statuses([refunded_id]) == {"Cancelled": 1}
        assert _statuses(i for i, _ in orders[1:]) == {"Paid": 19}
