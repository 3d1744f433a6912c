"""The checkout queue: orders in line for their payment page get their sessions as fast as the
provider's budget allows, in the order their customers arrived.

Why: the provider limits how many Checkout Sessions the whole account may create per second
(Stripe: 25 per endpoint by default), and a flash sale checks out faster than that. A checkout
whose session the budget (or this process's provider slots) cannot give at once still places
its order and holds its stock, and the order joins the line (`start.join_line`: the order's own
`payment_queued_at`, committed); its page says so and moves on to the hosted page by itself
once its session exists. Nobody clicks "Pay now" again and again, and nobody who checks out
later is served first: while anyone waits, customers' new sessions are refused by the guard
(`guard.LINE`) and join the line behind them.

Who serves the line: one `PaymentQueue` for the whole shop at a time, in a worker process (every
`flask shop worker` runs one in a thread; the `payment-queue` lease in the database decides which
one serves). It takes the oldest waiting orders, keeps up to `threads` session calls in flight
(each waits for the budget, patiently, and takes it in the line's order: `guard.queue_call`
with a `guard.Turnstile` ticket), and holds the line shut to newcomers
while it works. While the provider's breaker is open it pauses (the probe reopens the way).

Durable: the line is the database's (a partial index over the waiting orders). Redis only wakes
the queue early (an idle queue looks at the database every IDLE_POLL_SECONDS anyway), so a
Redis wipe costs at most that long; a worker killed while serving leaves its lease to the next
worker at once on the same machine (its pid is gone), or when the lease lapses elsewhere
(LEASE_SECONDS), and the orders it was starting are still in line (a session it created but did
not save is never shown to anyone, and expires by itself at the provider). An order whose pay-by
time passes while it waits is left to its deadline, which cancels it like any unpaid order
(leaving the line is part of that transition).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timedelta
from typing import cast

from flask import Flask, current_app
from sqlalchemy import and_, func, or_, select
from werkzeug.local import LocalProxy

from .. import clock, logs, queue, traces
from ..domain.deadlines import unpaid_hold_seconds, utcnow
from ..domain.order import OrderStatus
from ..extensions import db
from ..models import Order
from ..outbox.leases import acquire_lease, holder_name, release_lease, renew_lease
from ..provider import guard
from .start import LINE_HOLD_SECONDS, StartOutcome, StartStatus, start_payment

log = logging.getLogger("shop.payments.queue")

LEASE_NAME = "payment-queue"
# A queue whose worker died on another machine (so its pid cannot be checked) holds the line this
# long at most; renewed every third of it while serving.
LEASE_SECONDS = 10.0
# An idle queue looks at the database this often (a Redis wake-up usually comes first).
IDLE_POLL_SECONDS = 1.0
# A session call waits this long for the budget before the order is tried again (it keeps its place).
PATIENCE_SECONDS = 5.0
# How often a serving queue looks again when nothing of its own finished.
TICK_SECONDS = 0.2


def _still_held(now: datetime):
    """Orders still within their pay-by time (an order in line past it is its deadline's to
    cancel): one never given a session (PendingPayment) for UNPAID_HOLD_WITHOUT_SESSION_SECONDS
    after it was placed, one whose payment failed for the window after the failure."""
    cfg = current_app.config
    window = cfg["UNPAID_ORDER_EXPIRY_SECONDS"]
    hold = unpaid_hold_seconds(OrderStatus.PENDING_PAYMENT, window, cfg["UNPAID_HOLD_WITHOUT_SESSION_SECONDS"])
    return or_(
        and_(Order.status == OrderStatus.PENDING_PAYMENT, Order.updated_at > now - timedelta(seconds=hold)),
        and_(Order.status != OrderStatus.PENDING_PAYMENT, Order.updated_at > now - timedelta(seconds=window)),
    )


def _waiting(now: datetime):
    return and_(Order.payment_queued_at.is_not(None), _still_held(now))


def next_in_line(now: datetime, limit: int, skip=frozenset()) -> list[int]:
    """The first `limit` orders in line (arrival order), leaving out `skip` (already being started)."""
    rows = (
        db.session.execute(
            select(Order.id).where(_waiting(now)).order_by(Order.payment_queued_at, Order.id).limit(limit + len(skip))
        )
        .scalars()
        .all()
    )
    db.session.rollback()
    return [order_id for order_id in rows if order_id not in skip][:limit]


def anyone_waiting(now: datetime) -> bool:
    found = db.session.execute(select(Order.id).where(_waiting(now)).limit(1)).first() is not None
    db.session.rollback()
    return found


def line_length(now: datetime) -> tuple[int, datetime | None]:
    """(how many orders wait in line, when the first joined it): for /metrics and the console."""
    count, first = db.session.execute(
        select(func.count(), func.min(Order.payment_queued_at)).where(_waiting(now))
    ).one()
    return count, first


def place_in_line(order, now: datetime | None = None) -> int | None:
    """How many orders are ahead of this one in line (None when it is not in line)."""
    if order.payment_queued_at is None:
        return None
    mine = (order.payment_queued_at, order.id)
    return db.session.execute(
        select(func.count())
        .select_from(Order)
        .where(
            _waiting(now or utcnow()),
            or_(Order.payment_queued_at < mine[0], and_(Order.payment_queued_at == mine[0], Order.id < mine[1])),
        )
    ).scalar_one()


def expected_wait_seconds(ahead: int) -> float:
    """What the budget implies for someone with `ahead` orders before them."""
    return (ahead + 1) / current_app.config["STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND"]


class PaymentQueue:
    """Serves the line from one process: see the module's docstring."""

    def __init__(self, app, threads: int | None = None):
        self.app = app
        limits = guard.limits_from(app.config)
        # Leave some of this process's provider slots (the bulkhead) to its other work.
        self.threads = threads or max(1, limits.max_concurrent * 3 // 4)
        self.holder = holder_name()

    # The worker's thread -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: wait for orders in line, then serve them while this process holds the lease."""
        while not stop.is_set():
            try:
                with self.app.app_context():
                    try:
                        self._round(stop)
                    finally:
                        db.session.remove()
            except Exception:  # noqa: BLE001 - the queue must outlive a bad round (a database blip)
                log.exception("payment queue: a round failed; trying again")
                stop.wait(IDLE_POLL_SECONDS)

    def _round(self, stop: threading.Event) -> None:
        if not anyone_waiting(utcnow()):
            try:
                queue.wait_for_payment_queue(IDLE_POLL_SECONDS)
            except Exception as exc:  # noqa: BLE001 - Redis away: look at the database again later
                log.debug("payment queue: no wake-ups from Redis (%s)", exc)
                stop.wait(IDLE_POLL_SECONDS)
            return
        taken = acquire_lease(LEASE_NAME, self.holder, utcnow(), LEASE_SECONDS)
        if not taken:
            stop.wait(IDLE_POLL_SECONDS)  # another process serves the line
            return
        try:
            self.serve(stop)
        finally:
            release_lease(LEASE_NAME, self.holder)

    # Serving ----------------------------------------------------------------------------------

    def serve(self, stop: threading.Event | None = None) -> int:
        """Start the sessions of the orders in line, oldest first, until nobody waits (or the lease
        is lost, or `stop`). The caller holds the lease. Returns how many sessions it started."""
        stop = stop or threading.Event()
        provider_guard = guard.get()
        lease_until = clock.current().monotonic() + LEASE_SECONDS
        held_at = 0.0
        started = 0
        in_flight: dict[Future, int] = {}
        turns = guard.Turnstile()  # the budget goes to the calls in the line's order
        with ThreadPoolExecutor(self.threads, thread_name_prefix="payment-queue") as pool:
            while not stop.is_set():
                if clock.current().monotonic() > lease_until - LEASE_SECONDS * 2 / 3:
                    if not renew_lease(LEASE_NAME, self.holder, utcnow(), LEASE_SECONDS):
                        log.warning("payment queue: lost its lease; another process serves the line now")
                        break
                    lease_until = clock.current().monotonic() + LEASE_SECONDS
                if clock.current().monotonic() - held_at >= LINE_HOLD_SECONDS / 3:
                    provider_guard.hold_line(LINE_HOLD_SECONDS)
                    held_at = clock.current().monotonic()
                if provider_guard.breaker_view()["state"] is guard.BreakerState.CLOSED:
                    free = self.threads - len(in_flight)
                    ids = next_in_line(utcnow(), free, frozenset(in_flight.values())) if free else []
                    if not ids and not in_flight:
                        provider_guard.open_line()
                        break
                    for order_id in ids:
                        in_flight[pool.submit(self._start, order_id, turns.ticket())] = order_id
                # else: the provider is down; its probe reopens the way (no call of ours would go)
                done, _ = (
                    wait(list(in_flight), timeout=TICK_SECONDS, return_when=FIRST_COMPLETED)
                    if in_flight
                    else (set(), None)
                )
                if not in_flight:
                    stop.wait(TICK_SECONDS)
                for future in done:
                    order_id = in_flight.pop(future)
                    started += self._outcome(order_id, future) is StartStatus.STARTED
        return started

    def _start(self, order_id: int, turn: guard.Ticket) -> StartOutcome:
        # The order's lines (its provider call's among them) name it: shop.logs; so does its span.
        with (
            self.app.app_context(),
            logs.scope(order_id=order_id),
            traces.span("payment queue start", attributes={"backstop.order_id": order_id}),
            guard.queue_call(PATIENCE_SECONDS, turn),
        ):
            try:
                return start_payment(order_id, from_line=True)
            finally:
                turn.release()  # a start that made no call (the order moved) gives its turn up
                db.session.remove()

    @staticmethod
    def _outcome(order_id: int, future: Future) -> StartStatus | None:
        """How the start of `order_id`'s payment ended; None when it failed (it stays in line)."""
        try:
            outcome = future.result()
        except Exception:  # noqa: BLE001 - the order keeps its place and is tried again
            log.exception("payment queue: starting the payment of order %s failed; it stays in line", order_id)
            return None
        if outcome.status is StartStatus.STARTED:
            log.info("payment queue: order %s has its payment page", order_id)
        elif outcome.status is not StartStatus.QUEUED:
            log.info("payment queue: order %s left the line (%s: %s)", order_id, outcome.status, outcome.code)
        return outcome.status


def serve_now(app=None) -> int:
    """Serve the line once in this process, under the lease, until nobody waits: the sessions
    started, 0 when another process holds the lease (the tests' way to run the queue in-process)."""
    app = app or cast("LocalProxy[Flask]", current_app)._get_current_object()  # the app, not its proxy
    line = PaymentQueue(app)
    if not acquire_lease(LEASE_NAME, line.holder, utcnow(), LEASE_SECONDS):
        return 0
    try:
        return line.serve()
    finally:
        release_lease(LEASE_NAME, line.holder)


def start_in_background(app) -> tuple[threading.Thread, threading.Event]:
    """The worker's payment-queue thread (`flask shop worker`). Stops with the process, or `stop`."""
    stop = threading.Event()
    thread = threading.Thread(target=PaymentQueue(app).run, args=(stop,), name="payment-queue", daemon=True)
    thread.start()
    return thread, stop
