"""The checkout queue with real processes: `flask shop worker` serves the line by itself (its
payment-queue thread), and an order in line reaches its payment page with no customer action
even when the worker serving it is SIGKILLed mid-call and Redis loses everything (the line is
the database's; the next worker takes the lease of a dead one on the same machine at once)."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from factories import place_order_for, seed_catalog_rows
from process_support import Processes, process_env
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Lease, Order
from shop.payments import checkout_queue
from shop.payments.start import join_line
from support import wait_until

pytestmark = pytest.mark.slow


def _states(app, ids: list[int]) -> dict[int, tuple]:
    with app.app_context():
        rows = db.session.execute(
            select(Order.id, Order.status, Order.payment_session_id, Order.payment_queued_at).where(Order.id.in_(ids))
        ).all()
        db.session.remove()
    return {r.id: (r.status, r.payment_session_id, r.payment_queued_at) for r in rows}


def _lease(app):
    with app.app_context():
        holder = db.session.execute(select(Lease.holder).where(Lease.name == checkout_queue.LEASE_NAME)).scalar()
        db.session.remove()
    return holder


def _hold_lease_an_hour(app) -> str | None:
    """Push the line's lease an hour past now, as a live holder's would stand; returns its holder."""
    holder = _lease(app)
    with app.app_context():
        db.session.execute(
            update(Lease)
            .where(Lease.name == checkout_queue.LEASE_NAME)
            .values(expires_at=utcnow() + timedelta(hours=1))
        )
        db.session.commit()
        db.session.remove()
    return holder


def test_orders_in_line_reach_their_payment_page_across_a_killed_worker_and_a_wiped_redis(
    make_fresh_app, sandbox, redis_conn
):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60)
    env = process_env(
        app,
        STRIPE_API_BASE=sandbox.base_url,
        UNPAID_ORDER_EXPIRY_SECONDS="1800",
        RECONCILIATION_STUCK_AGE_SECONDS="1800",
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND="2",
    )
    with app.app_context():
        seed_catalog_rows()
        ids = [place_order_for({"NB-A5-DOT": 1}).order_id for _ in range(6)]
        for order_id in ids:
            join_line(order_id, utcnow())  # what a checkout past the budget does
        db.session.remove()
    # Slow session creates, so the first worker dies with calls in flight.
    sandbox.faults(api_latency_seconds=1.5)
    procs = Processes()
    try:
        first = procs.start("worker-1", ["shop", "worker"], env)
        wait_until(lambda: sandbox.request_count(method="POST") >= 1, 30, "the first session call", procs.logs)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        redis_conn.flushdb()  # Redis loses every wake-up, the line flag and the budget's state
        assert not any(status == "PaymentInitiated" for status, _, _ in _states(app, ids).values()), (
            "the calls were meant to be in flight when the worker died"
        )

        # The dead worker's lease is made to hold for an hour: the line can only be served within
        # this test if the next worker sees that the holder's pid is gone and takes the lease over.
        assert _hold_lease_an_hour(app) is not None, "the first worker was meant to hold the line's lease"
        sandbox.faults(api_latency_seconds=0)
        procs.start("worker-2", ["shop", "worker"], env)
        wait_until(
            lambda: all(s == "PaymentInitiated" for s, _, _ in _states(app, ids).values()),
            60,
            "every order in line to get its payment page",
            procs.logs,
        )
        # Nobody waits any more: the serving worker gives its lease up (and stands by).
        wait_until(lambda: _lease(app) is None, 10, "the payment queue to release its lease", procs.logs)
    finally:
        procs.stop()
    states = _states(app, ids)
    assert all(sid and queued_at is None for _, sid, queued_at in states.values()), states
    assert len({sid for _, sid, _ in states.values()}) == len(ids)
