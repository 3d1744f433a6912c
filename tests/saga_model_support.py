"""The state machine behind tests/saga/test_saga_model.py: the rules (what customers, the provider,
the network, the workers, Redis and the operator can do), the reference model and the
invariants. Every rule calls the shop's own use cases or routes; nothing is mocked.

One clock for everything: the sandbox's (wall time plus its offset), made the shop's clock
(shop.clock, `install_clock`), so a session expires at the provider exactly when the shop thinks
its time is up, and "advance the clock" moves both. The provider guard's shared state in Redis
(its rate budget's buckets and windows, the breaker) takes its time from that clock too
(`shared_time`), not from Redis's TIME: otherwise a call the budget refused would stay refused
while the model's minutes pass in milliseconds of Redis's time.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import select, text, update

from factories import cart_with
from payment_helpers import WEBHOOK_SECRET, signature
from shop import clock as shop_clock
from shop import failpoints  # noqa: F401  (the failpoint below is read from the environment)
from shop.clock import SystemClock
from shop.domain.deadlines import as_utc, unpaid_deadline
from shop.extensions import db
from shop.models import InventoryItem, Order, OutboxDelivery, Refund, ScheduledCommand, Variant, WorkStatus
from shop.orders.cancel import PROVIDER_EXPIRY_GRACE, cancel_order
from shop.orders.checkout import place_order
from shop.outbox import requeue, runner
from shop.outbox.dispatch import drain_deliveries, run_command, run_delivery
from shop.outbox.relay import relay_once
from shop.payments.apply import reconcile_order
from shop.payments.start import start_payment
from shop.provider import gateway
from shop.scheduling.sweep import run_cycle
from shop.stripe_sandbox.testing import SandboxControlError

SKUS = ("NB-A5-DOT", "MUG-350-SND", "SOCK-M")
WINDOW = 300  # seconds an unpaid order holds its stock (and the sweep's stuck age)
LIVE = ("PendingPayment", "PaymentInitiated", "PaymentFailed")
KEEP_TABLES = {"products", "variants", "inventory", "operators"}
CRASH = "restore_inventory.after_marker_flush=raise"


class SandboxClock(SystemClock):
    """The sandbox's clock: the system's time of day plus whatever the test advanced it by, for the
    shop and for the guard's shared state in Redis alike."""

    def __init__(self, sandbox_state):
        self.state = sandbox_state

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), timezone.utc)

    def time(self) -> float:
        return time.time() + self.state.clock_offset

    def shared_time(self) -> float | None:
        return self.time()


def install_clock(monkeypatch, sandbox) -> None:
    """The shop's clock (shop.clock) is the sandbox's, until the test ends (conftest puts the
    system's back). `monkeypatch` is no longer needed: the clock is the process's, set once."""
    shop_clock.use(SandboxClock(sandbox.sandbox))


@dataclass
class World:
    """What lives across examples: one app, the sandbox, Redis; and run statistics."""

    app: object
    sandbox: object
    redis: object
    is_postgres: bool
    examples: int = 0
    steps: int = 0
    counts: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)

    CONFIG = dict(
        STRIPE_SESSION_MIN_SECONDS=60,
        STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET,
        UNPAID_ORDER_EXPIRY_SECONDS=WINDOW,
        RECONCILIATION_STUCK_AGE_SECONDS=WINDOW,
        RECONCILIATION_INTERVAL_SECONDS=60,
        OUTBOX_RETRY_BASE_SECONDS=0.05,
        OUTBOX_RETRY_CAP_SECONDS=0.2,
    )

    def reset(self, stock: dict[str, int]) -> dict[int, int]:
        """Empty every table but the catalog, set the stock, forget the sandbox and Redis."""
        self.redis.flushdb()
        self.sandbox.reset()
        with self.app.app_context():
            tables = [t.name for t in reversed(db.metadata.sorted_tables) if t.name not in KEEP_TABLES]
            with db.engine.begin() as conn:
                if self.is_postgres:
                    conn.execute(text("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " CASCADE"))
                else:
                    for t in tables:
                        conn.execute(text(f'DELETE FROM "{t}"'))
                ids = {}
                for sku, n in stock.items():
                    vid = conn.execute(select(Variant.id).where(Variant.sku == sku)).scalar_one()
                    conn.execute(update(InventoryItem).where(InventoryItem.variant_id == vid).values(on_hand=n))
                    ids[vid] = n
        return ids


@dataclass
class ModelOrder:
    id: int
    reference: str
    lines: dict[int, int]
    total: int


class SagaModel(RuleBasedStateMachine):
    world: World

    # -- plumbing --------------------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self.world.sandbox.sandbox.clock_offset, timezone.utc)

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.world.sandbox.advance_clock(seconds)
            self.collect_events()

    def ctx(self):
        return self.world.app.app_context()

    def note(self, what: str) -> None:
        self.world.counts[what] += 1

    def collect_events(self) -> None:
        """Every event the sandbox emitted since the last look joins the undelivered pool."""
        state = self.world.sandbox.sandbox
        with state.lock:
            fresh = sorted((e for e in state.events.values() if e.seq > self.seen_seq), key=lambda e: e.seq)
            for event in fresh:
                self.pool.append((event.id, event.type, event.body))
                self.seen_seq = max(self.seen_seq, event.seq)

    def provider(self) -> dict:
        """A copy of the sandbox's sessions, payment intents and refunds."""
        state = self.world.sandbox.sandbox
        with state.lock:
            sessions = {
                s.id: dict(
                    id=s.id,
                    order_id=int(s.metadata.get("order_id", 0)),
                    status=s.status,
                    payment_status=s.payment_status,
                    amount=s.amount_total,
                    expires_at=s.expires_at,
                    pi=s.payment_intent_id,
                    pi_status=state.payment_intents[s.payment_intent_id].status if s.payment_intent_id else None,
                )
                for s in state.sessions.values()
            }
            refunds = [dict(id=r.id, pi=r.payment_intent_id, amount=r.amount) for r in state.refunds.values()]
        return {"sessions": sessions, "refunds": refunds}

    def shop(self) -> dict:
        """The shop's rows the invariants read, in one short read."""
        with self.ctx():
            s = db.session
            orders = {
                o.id: dict(
                    status=o.status,
                    version=o.version,
                    restored=o.inventory_restored,
                    session=o.payment_session_id,
                    total=o.total,
                    updated_at=as_utc(o.updated_at),
                    session_expires=as_utc(o.payment_session_expires_at) if o.payment_session_expires_at else None,
                    reference=o.reference,
                )
                for o in s.execute(select(Order)).scalars()
            }
            stock = dict(
                s.execute(
                    select(InventoryItem.variant_id, InventoryItem.on_hand).where(
                        InventoryItem.variant_id.in_(list(self.initial))
                    )
                ).all()
            )
            refunds = [
                dict(order_id=r.order_id, session=r.session_id, status=r.status, id=r.id)
                for r in s.execute(select(Refund)).scalars()
            ]
            deliveries = [
                dict(
                    id=d.id,
                    handler=d.handler,
                    order_id=d.order_id,
                    status=d.status,
                    next=as_utc(d.next_attempt_at),
                    until=as_utc(d.claimed_until) if d.claimed_until else None,
                )
                for d in s.execute(select(OutboxDelivery)).scalars()
            ]
            commands = [
                dict(
                    id=c.id,
                    kind=c.kind,
                    order_id=c.order_id,
                    status=c.status,
                    payload=c.payload,
                    next=as_utc(c.next_attempt_at),
                    until=as_utc(c.claimed_until) if c.claimed_until else None,
                )
                for c in s.execute(select(ScheduledCommand)).scalars()
            ]
            db.session.remove()
        return dict(orders=orders, stock=stock, refunds=refunds, deliveries=deliveries, commands=commands)

    def pick(self, items, index: int):
        items = list(items)
        return items[index % len(items)] if items else None

    def concurrently(self, *calls) -> list:
        """Run each call in its own thread with its own app context; re-raise the first error."""
        results, errors = [None] * len(calls), []

        def one(i, fn):
            try:
                with self.ctx():
                    results[i] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed back below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i, fn)) for i, fn in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        return results

    # -- setup -----------------------------------------------------------------------------

    @initialize(
        stock=st.tuples(st.integers(2, 5), st.integers(2, 5), st.integers(1, 4)),
        carts=st.lists(
            st.lists(st.tuples(st.integers(0, 2), st.integers(1, 2)), min_size=1, max_size=2), min_size=1, max_size=4
        ),
    )
    def reset(self, stock, carts):
        """A fresh world, and a few checkouts so every interleaving has orders to work on."""
        self.world.examples += 1
        if self.world.examples % 10 == 0:  # a sign of life in the long profile (shown with -s)
            print(
                f"saga model: {self.world.examples} interleavings so far, "
                f"{time.monotonic() - self.world.started:.0f} s",
                flush=True,
            )
        self.initial = self.world.reset(dict(zip(SKUS, stock, strict=True)))
        self.variants = sorted(self.initial)
        with self.ctx():
            self.prices = dict(
                db.session.execute(select(Variant.id, Variant.price).where(Variant.id.in_(self.variants))).all()
            )
            db.session.remove()
        self.orders: dict[int, ModelOrder] = {}
        self.pool: list[tuple[str, str, bytes]] = []  # undelivered (or re-deliverable) webhook events
        self.seen_seq = 0
        self.unrestorable: set[int] = set()  # orders whose restore the operator discarded
        self.unrefundable: set[int] = set()  # refunds whose command the operator discarded
        self.client = self.world.app.test_client()
        for cart in carts:
            self.place(cart, pay=True)

    def expected_stock(self, orders: dict) -> dict[int, int]:
        """The reference: what is on hand is the initial stock less every order's lines, except
        cancelled orders whose stock was given back (the marker and the increments commit
        together, so this holds after every step, not only when drained)."""
        expected = dict(self.initial)
        for oid, model in self.orders.items():
            row = orders[oid]
            if row["status"] == "Cancelled" and row["restored"]:
                continue
            for vid, q in model.lines.items():
                expected[vid] -= q
        return expected

    # -- customers -------------------------------------------------------------------------

    @rule(
        cart=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), min_size=1, max_size=2),
        pay=st.sampled_from([True, True, True, False]),
    )
    def place(self, cart, pay):
        lines: dict[int, int] = {}
        for index, q in cart:
            vid = self.variants[index]
            lines[vid] = lines.get(vid, 0) + q
        before = self.shop()
        available = self.expected_stock(before["orders"])
        fits = all(q <= available[v] for v, q in lines.items())
        with self.ctx():
            cart_id, browser = cart_with(sorted(lines.items()))
            placed = place_order(cart_id=cart_id, browser_id=browser, email=f"{browser}@example.com", now=self.now())
            assert placed.ok == fits, (
                f"cart {lines} against {available}: the model expected "
                f"{'success' if fits else 'out_of_stock'}, the shop said {placed}"
            )
            if not placed.ok:
                assert placed.code == "out_of_stock", placed
                self.note("place refused")
                db.session.remove()
                return
            total = sum(self.prices[v] * q for v, q in lines.items())
            assert placed.total == total
            self.orders[placed.order_id] = ModelOrder(placed.order_id, placed.reference, lines, total)
            self.note("placed")
            if pay:  # the checkout route starts the payment in the same request
                outcome = start_payment(placed.order_id, now=self.now(), placed=placed)
                assert outcome.status == "started", outcome
            db.session.remove()
        self.collect_events()

    # Few rules, each with many actions: hypothesis switches whole rules off in some
    # interleavings (swarm testing), and money needs several provider and customer actions in
    # one interleaving (an async payment, a cancel, then the payment settling) to be exercised.

    @rule(
        pick=st.integers(0, 99),
        what=st.sampled_from(
            [
                "paid",
                "paid",
                "declined",
                "async_pending",
                "async_pending",
                "async_succeeded",
                "async_succeeded",
                "async_failed",
                "expired_early",
            ]
        ),
    )
    def the_provider(self, pick, what):
        """The customer at the hosted page (pays, is declined, pays asynchronously), an async
        payment settling, or the session expired early by hand at the provider."""
        if what.startswith("async_") and what != "async_pending":
            self.async_payment_settles(pick, what.split("_", 1)[1])
        elif what == "expired_early":
            self.session_expired_early_at_the_provider(pick)
        else:
            self.at_the_hosted_page(pick, what)

    @rule(
        pick=st.integers(0, 99),
        what=st.sampled_from(["cancel", "cancel", "stale_cancel", "pay_now", "return", "return_older"]),
    )
    def the_customer(self, pick, what):
        """Cancel with the version seen (or a stale one), "Pay now", or back on the return page."""
        if what in ("cancel", "stale_cancel"):
            self.customer_cancels(pick, stale=what == "stale_cancel")
        elif what == "pay_now":
            self.pay_now(pick)
        else:
            self.return_page(pick, any_session=what == "return_older")

    def pay_now(self, pick):
        """The "Pay now" button: only an unpaid order can start a payment."""
        oid = self.pick(self.orders, pick)
        if oid is None:
            return
        before = self.shop()["orders"][oid]["status"]
        with self.ctx():
            outcome = start_payment(oid, now=self.now())
            db.session.remove()
        if before in ("PendingPayment", "PaymentFailed"):
            assert outcome.status == "started", (before, outcome)
        else:
            assert outcome.status == "refused", (before, outcome)
        self.note(f"pay now: {outcome.status}")
        self.collect_events()

    def sessions_where(self, test) -> list[str]:
        return sorted(sid for sid, s in self.provider()["sessions"].items() if test(s))

    def at_the_hosted_page(self, pick, outcome):
        sid = self.pick(self.sessions_where(lambda s: s["status"] == "open"), pick)
        if sid is None:
            return
        try:
            self.world.sandbox.set_outcome(sid, outcome)
        except SandboxControlError as exc:  # expired between the look and the click
            assert exc.status == 409, exc
            return
        self.note(f"hosted page: {outcome}")
        self.collect_events()

    def async_payment_settles(self, pick, result):
        sid = self.pick(self.sessions_where(lambda s: s["pi_status"] == "processing"), pick)
        if sid is None:
            return
        self.world.sandbox.async_result(sid, result)
        self.note(f"async {result}")
        self.collect_events()

    def session_expired_early_at_the_provider(self, pick):
        sid = self.pick(self.sessions_where(lambda s: s["status"] == "open"), pick)
        if sid is None:
            return
        with self.ctx():
            try:
                gateway.expire_session(sid)
            except gateway.ProviderRefused:
                return  # its time ran out between the look and the call (the clock does not stop)
        self.note("expired early")
        self.collect_events()

    def return_page(self, pick, any_session):
        """The browser comes back to the success URL (with its order's session, or an older one)."""
        oid = self.pick(self.orders, pick)
        if oid is None:
            return
        sessions = self.sessions_where(lambda s: s["order_id"] == oid)
        if not sessions:
            return
        sid = sessions[pick % len(sessions)] if any_session else sessions[-1]
        r = self.client.get(f"/checkout/return?order={self.orders[oid].reference}&session_id={sid}")
        assert r.status_code in (303, 404), r.status_code
        self.note("return page")

    def customer_cancels(self, pick, stale):
        oid = self.pick(self.orders, pick)
        if oid is None:
            return
        row = self.shop()["orders"][oid]
        version = row["version"] - 1 if stale and row["version"] > 1 else row["version"]
        with self.ctx():
            outcome = cancel_order(oid, version)
            status = outcome.status
            db.session.remove()
        self.collect_events()
        if version != row["version"]:
            assert status == "conflict", (row, outcome)
        elif row["status"] in ("Paid", "Cancelled"):
            assert status == "refused", (row, outcome)
        if status == "cancelled" and row["session"]:
            paid = self.provider()["sessions"][row["session"]]["payment_status"] == "paid"
            assert not paid, f"order {oid} was cancelled although its session {row['session']} is paid"
        self.note(f"cancel: {status}")

    # -- time ------------------------------------------------------------------------------

    @rule(
        how=st.sampled_from(["seconds", "minute", "to_session_expiry", "past_session_expiry", "window"]),
        pick=st.integers(0, 99),
    )
    def time_passes(self, how, pick):
        if how == "seconds":
            self.advance(1 + pick % 10)
        elif how == "minute":
            self.advance(60)
        elif how == "window":
            self.advance(WINDOW + 5)
        else:
            open_ = [s["expires_at"] for s in self.provider()["sessions"].values() if s["status"] == "open"]
            if not open_:
                return
            target = sorted(open_)[pick % len(open_)] + (0 if how == "to_session_expiry" else 20)
            self.advance(target - time.time() - self.world.sandbox.sandbox.clock_offset + 0.05)
        self.note(f"time: {how}")

    # -- the network -----------------------------------------------------------------------

    @rule(pick=st.integers(0, 99), again=st.booleans())
    def webhook_delivered(self, pick, again):
        """Any waiting event (so: reordered, or late), kept for a second delivery or not."""
        if not self.pool:
            return
        index = pick % len(self.pool)
        event_id, event_type, body = self.pool[index] if again else self.pool.pop(index)
        r = self.client.post(
            "/webhooks/stripe",
            data=body,
            headers={"Stripe-Signature": signature(body), "Content-Type": "application/json"},
        )
        assert r.status_code == 200, (r.status_code, r.get_data(as_text=True))
        outcome = r.get_json()["outcome"]
        assert outcome != "failed", f"{event_type} {event_id} was accepted but not applied"
        self.last_webhook = outcome  # what the fixed journeys (test_saga_model.py) pin
        self.note(f"webhook {event_type.rsplit('.', 1)[-1]}: {outcome}")
        self.collect_events()

    @rule(pick=st.integers(0, 99))
    def webhook_lost(self, pick):
        if not self.pool:
            return
        self.pool.pop(pick % len(self.pool))
        self.note("webhook lost")

    # -- deadlines, sweep, outbox ----------------------------------------------------------

    def deadline_rows(self) -> list[dict]:
        return [c for c in self.shop()["commands"] if c["kind"] == "expire_unpaid_order" and c["status"] == "pending"]

    @rule(pick=st.integers(0, 99), when=st.sampled_from(["now", "early", "on_time", "late", "twice", "concurrently"]))
    def deadline_fires(self, pick, when):
        row = self.pick(self.deadline_rows(), pick)
        if row is None:
            return
        due_in = (row["next"] - self.now()).total_seconds()
        if when == "early":
            self.advance(due_in - 1.5)
        elif when in ("on_time", "twice", "concurrently"):
            self.advance(due_in)
        elif when == "late":
            self.advance(due_in + 30 + pick)
        if when == "concurrently":
            results = self.concurrently(
                lambda: run_command(row["id"], now=self.now()), lambda: run_command(row["id"], now=self.now())
            )
        else:
            with self.ctx():
                results = [run_command(row["id"], now=self.now())]
                if when == "twice":
                    results.append(run_command(row["id"], now=self.now()))
        self.last_deadline = "/".join(results)  # what the fixed journeys (test_saga_model.py) pin
        self.note(f"deadline {when}: {self.last_deadline}")
        self.collect_events()

    @rule(what=st.sampled_from(["sweep", "sweep", "redis", "drain", "drain", "quiesce"]))
    def background(self, what):
        """What runs on its own: the sweep, Redis losing its data (then the relay), every queue
        drained (then the drained invariants), or a long quiet time (then all of them)."""
        {
            "sweep": self.sweep_cycle,
            "redis": self.redis_loses_everything,
            "drain": self.drain_everything,
            "quiesce": self.quiesce,
        }[what]()

    def sweep_cycle(self):
        with self.ctx():
            result = run_cycle(now=self.now())
            db.session.remove()
        assert result.status == "ok", result.summary()
        self.note("sweep")
        self.collect_events()

    def due_deliveries(self) -> list[dict]:
        now = self.now()
        return [
            d
            for d in self.shop()["deliveries"]
            if (d["status"] == "pending" and d["next"] <= now)
            or (d["status"] == "processing" and d["until"] and d["until"] < now)
        ]

    @rule(
        pick=st.integers(0, 99),
        how=st.sampled_from(
            ["drain", "one", "twice_at_once", "drains_at_once", "crash_mid_transaction", "worker_dies_holding_claim"]
        ),
    )
    def outbox_runs(self, pick, how):
        if how == "drain":
            with self.ctx():
                drain_deliveries(now=self.now())
        elif how == "drains_at_once":
            self.concurrently(lambda: drain_deliveries(now=self.now()), lambda: drain_deliveries(now=self.now()))
        else:
            due = self.due_deliveries()
            if how == "crash_mid_transaction":
                due = [d for d in due if d["handler"] == "restore_inventory"]
            row = self.pick(due, pick)
            if row is None:
                return
            if how == "one":
                with self.ctx():
                    run_delivery(row["id"], now=self.now())
            elif how == "twice_at_once":
                self.concurrently(
                    lambda: run_delivery(row["id"], now=self.now()), lambda: run_delivery(row["id"], now=self.now())
                )
            elif how == "crash_mid_transaction":
                # The compensation raises after writing its marker, before its commit: as if the
                # worker died there. Nothing it wrote may survive; the row is retried.
                # Up to five times in a row: the fifth spends the last attempt (a dead letter).
                for _ in range(1 + pick % 5):
                    os.environ["BACKSTOP_FAILPOINTS"] = CRASH
                    try:
                        with self.ctx():
                            result = run_delivery(row["id"], now=self.now())
                    finally:
                        os.environ.pop("BACKSTOP_FAILPOINTS", None)
                    assert result in ("retry", "dead"), result
                    if result == "dead":
                        break
                    self.advance(1)  # past the retry's backoff
            else:  # claimed by a worker that is then SIGKILLed: its lease must lapse
                with self.ctx():
                    runner.claim(OutboxDelivery, row["id"], self.now(), "worker-killed-after-claim")
                    db.session.remove()
        self.note(f"outbox {how}")
        self.collect_events()

    def redis_loses_everything(self):
        self.world.redis.flushdb()
        with self.ctx():
            relay_once(now=self.now())
            db.session.remove()
        self.note("redis flushed + relay")

    # -- races ---------------------------------------------------------------------------

    RACERS = ("webhook", "cancel", "pay", "deadline", "sweep", "return", "reconcile", "drain")

    def racer(self, what: str, oid: int, pick: int):
        """One actor of a race, as a call to run in its own thread (None when it has nothing to do)."""
        if what == "webhook":
            if not self.pool:
                return None
            _, _, body = self.pool[pick % len(self.pool)]
            client = self.world.app.test_client()
            return lambda: (
                client.post(
                    "/webhooks/stripe",
                    data=body,
                    headers={"Stripe-Signature": signature(body), "Content-Type": "application/json"},
                ).status_code
            )
        if what == "cancel":
            version = self.shop()["orders"][oid]["version"]
            return lambda: cancel_order(oid, version).status
        if what == "pay":
            return lambda: start_payment(oid, now=self.now()).status
        if what == "deadline":
            rows = [c for c in self.deadline_rows() if c["order_id"] == oid]
            return (lambda: run_command(rows[-1]["id"], now=self.now())) if rows else None
        if what == "sweep":
            return lambda: run_cycle(now=self.now()).status
        if what == "return":
            sessions = self.sessions_where(lambda s: s["order_id"] == oid)
            if not sessions:
                return None
            client, ref = self.world.app.test_client(), self.orders[oid].reference
            return lambda: client.get(f"/checkout/return?order={ref}&session_id={sessions[-1]}").status_code
        if what == "reconcile":
            return lambda: reconcile_order(oid, source="console", now=self.now()).outcome
        return lambda: drain_deliveries(now=self.now())

    @rule(pick=st.integers(0, 99), first=st.sampled_from(RACERS), second=st.sampled_from(RACERS))
    def two_things_at_once(self, pick, first, second):
        """Two actors on one order at the same moment (webhook, customer, deadline, sweep, return
        page, operator, a drain): whoever wins, the other must lose cleanly."""
        oid = self.pick(self.orders, pick)
        if oid is None:
            return
        calls = [self.racer(first, oid, pick), self.racer(second, oid, pick + 1)]
        if None in calls:
            return
        results = self.concurrently(*calls)
        for name, result in zip((first, second), results, strict=True):
            if name in ("webhook",):
                assert result == 200, result
            if name == "return":
                assert result in (303, 404), result
        self.note(f"race {first}/{second}")
        self.collect_events()

    # -- the operator ----------------------------------------------------------------------

    def dead_rows(self) -> list[tuple[str, dict]]:
        data = self.shop()
        return [("delivery", d) for d in data["deliveries"] if d["status"] == "dead"] + [
            ("command", c) for c in data["commands"] if c["status"] == "dead"
        ]

    @rule(pick=st.integers(0, 99), action=st.sampled_from(["retry", "retry", "discard"]))
    def operator_handles_a_dead_letter(self, pick, action):
        found = self.pick(self.dead_rows(), pick)
        if found is None:
            return
        kind, row = found
        model = OutboxDelivery if kind == "delivery" else ScheduledCommand
        with self.ctx():
            if action == "retry":
                assert requeue.retry_dead(model, row["id"], now=self.now())
            else:
                assert requeue.discard(model, row["id"], "model test: operator gave up", now=self.now())
                if kind == "delivery" and row["handler"] == "restore_inventory":
                    self.unrestorable.add(row["order_id"])
                if kind == "command" and row["kind"] == "refund_payment":
                    self.unrefundable.add(row["payload"]["refund_id"])
            db.session.remove()
        self.note(f"operator {action} dead {kind}")

    @rule(pick=st.integers(0, 99))
    def operator_reconciles(self, pick):
        oid = self.pick(self.orders, pick)
        if oid is None:
            return
        with self.ctx():
            applied = reconcile_order(oid, source="console", now=self.now())
            db.session.remove()
        self.note(f"reconcile: {applied.outcome}")
        self.collect_events()

    # -- settling --------------------------------------------------------------------------

    def run_due_work(self, rounds: int = 60) -> None:
        """Run every due command and delivery until none is due. Waits (by moving the clock) for
        retry backoffs and for the leases of workers that died; never for a future deadline.
        Every wait is on the one clock: a row the provider's rate budget sent back is due when the
        clock has passed the budget's wait, and so is the budget (`SandboxClock.shared_time`)."""
        rescheduled: Counter = Counter()  # rows their own run put back for later, and how often
        for _ in range(rounds):
            now = self.now()
            data = self.shop()
            due_commands = [
                c["id"]
                for c in data["commands"]
                if (c["status"] == "pending" and c["next"] <= now) or (c["status"] == "processing" and c["until"] < now)
            ]
            for cid in due_commands:
                with self.ctx():
                    rescheduled[cid] += run_command(cid, now=self.now()) == runner.RunOutcome.RESCHEDULED
            with self.ctx():
                ran = drain_deliveries(now=self.now())
            ran_any = bool(due_commands) or any(v for k, v in ran.items() if k != "more")
            if ran_any:
                self.collect_events()
                continue
            waits = [d["next"] for d in data["deliveries"] if d["status"] == "pending"]
            waits += [r["until"] for r in data["deliveries"] + data["commands"] if r["status"] == "processing"]
            waits += [
                c["next"]
                for c in data["commands"]
                if c["status"] == "pending" and c["next"] <= now + timedelta(seconds=5)
            ]
            if not waits:
                return
            self.advance((min(waits) - now).total_seconds() + 0.05)
        data = self.shop()
        finished = (WorkStatus.DONE, WorkStatus.DISCARDED, WorkStatus.OBSOLETE)
        left = [r for r in data["deliveries"] + data["commands"] if r["status"] not in finished]
        raise AssertionError(
            f"the outbox did not settle: work stays due after {rounds} rounds (now {self.now()}): {left}; "
            f"commands their own run put back for later (id: times): {dict(+rescheduled)}"
        )

    def drain_everything(self):
        self.run_due_work()
        self.check_drained()
        self.note("drained")

    def quiesce(self):
        self.settle_completely()
        self.note("quiesced")

    def settle_completely(self) -> None:
        """Time passes beyond every window; deadlines, sweeps and drains run; the operator
        retries whatever died. Then everything the provider knows must be accounted for."""
        for _ in range(3):
            self.advance(WINDOW + 10)
            self.run_due_work()
            with self.ctx():
                assert run_cycle(now=self.now()).status == "ok"
                db.session.remove()
            self.collect_events()
            self.run_due_work()
            with self.ctx():
                for kind, row in self.dead_rows():
                    requeue.retry_dead(
                        OutboxDelivery if kind == "delivery" else ScheduledCommand, row["id"], now=self.now()
                    )
                db.session.remove()
            self.run_due_work()
        self.check_drained()
        self.check_settled()

    def teardown(self):
        if getattr(self, "initial", None) is not None:
            self.settle_completely()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def stock_is_never_negative_and_matches_the_model(self):
        if not getattr(self, "initial", None):
            return
        self.world.steps += 1
        data = self.shop()
        for vid, n in data["stock"].items():
            assert n >= 0, f"variant {vid} has {n} on hand"
        expected = self.expected_stock(data["orders"])
        assert data["stock"] == expected, (
            f"stock {data['stock']} but the model says {expected}",
            {o: (r["status"], r["restored"]) for o, r in data["orders"].items()},
        )
        for oid, row in data["orders"].items():
            assert not row["restored"] or row["status"] == "Cancelled", f"order {oid} restored while {row['status']}"

    @invariant()
    def money_is_never_wrong(self):
        if not getattr(self, "initial", None):
            return
        data, provider = self.shop(), self.provider()
        sessions = provider["sessions"]
        refunds_by_pi = Counter(r["pi"] for r in provider["refunds"])
        for pi, n in refunds_by_pi.items():
            assert n == 1, f"payment {pi} refunded {n} times at the provider"
        for oid, row in data["orders"].items():
            if row["status"] != "Paid":
                continue
            session = sessions.get(row["session"])
            assert session is not None and session["payment_status"] == "paid", (
                f"order {oid} is Paid but its session {row['session']} is {session}"
            )
            assert session["order_id"] == oid and session["amount"] == row["total"], (oid, row, session)
            assert refunds_by_pi.get(session["pi"], 0) == 0, f"order {oid} is Paid and its own payment was refunded"
        for refund in data["refunds"]:
            if refund["status"] == "succeeded":
                pi = sessions[refund["session"]]["pi"]
                assert refunds_by_pi.get(pi) == 1, f"shop refund {refund} has no refund at the provider"

    def check_drained(self) -> None:
        """Nothing is due: every cancellation has given its stock back exactly once, stock is
        conserved, every refund the shop decided on happened at the provider."""
        data, provider = self.shop(), self.provider()
        # A restore that died (its fifth crash) is an operator's to retry: until then its stock is
        # held back, and accounted for as such, like one the operator discarded.
        dead_restores = {
            d["order_id"] for d in data["deliveries"] if d["status"] == "dead" and d["handler"] == "restore_inventory"
        }
        unrestored_ok = self.unrestorable | dead_restores
        for oid, row in data["orders"].items():
            if row["status"] == "Cancelled" and oid not in unrestored_ok:
                assert row["restored"], f"order {oid} is cancelled but its stock was not given back"
        for vid in self.variants:
            held = sum(m.lines.get(vid, 0) for oid, m in self.orders.items() if data["orders"][oid]["status"] in LIVE)
            sold = sum(m.lines.get(vid, 0) for oid, m in self.orders.items() if data["orders"][oid]["status"] == "Paid")
            stuck = sum(
                m.lines.get(vid, 0)
                for oid, m in self.orders.items()
                if oid in unrestored_ok and not data["orders"][oid]["restored"]
            )
            assert self.initial[vid] == data["stock"][vid] + held + sold + stuck, (
                vid,
                self.initial[vid],
                data["stock"][vid],
                held,
                sold,
                stuck,
            )
        for refund in data["refunds"]:
            if refund["id"] not in self.unrefundable:
                assert refund["status"] == "succeeded", f"refund {refund} was not made"
        shop_refunded = sorted(r["session"] for r in data["refunds"] if r["status"] == "succeeded")
        provider_refunded = sorted(
            s["id"]
            for s in provider["sessions"].values()
            if s["pi"] and any(r["pi"] == s["pi"] for r in provider["refunds"])
        )
        assert shop_refunded == provider_refunded, (shop_refunded, provider_refunded)

    def check_settled(self) -> None:
        """After windows ran out and deadlines and sweeps ran: every paid session is its order's
        payment or refunded exactly once, and nothing is still live past its pay-by."""
        data, provider = self.shop(), self.provider()
        refunded = Counter(r["pi"] for r in provider["refunds"])
        unrefundable_sessions = {r["session"] for r in data["refunds"] if r["id"] in self.unrefundable}
        for sid, s in provider["sessions"].items():
            if s["payment_status"] != "paid":
                continue
            order = data["orders"][s["order_id"]]
            if order["status"] == "Paid" and order["session"] == sid:
                assert refunded[s["pi"]] == 0, f"session {sid} is order {s['order_id']}'s payment and was refunded"
            elif sid not in unrefundable_sessions:
                assert refunded[s["pi"]] == 1, (
                    f"session {sid} was paid, is not order {s['order_id']}'s payment "
                    f"({order['status']}, {order['session']}) and was refunded "
                    f"{refunded[s['pi']]} times"
                )
        now = self.now()
        slack = timedelta(seconds=5) + PROVIDER_EXPIRY_GRACE
        for oid, row in data["orders"].items():
            if row["status"] in ("PendingPayment", "PaymentFailed"):
                pay_by = unpaid_deadline(row["updated_at"], WINDOW)
                assert pay_by + slack > now, f"order {oid} is {row['status']} past its pay-by {pay_by} (now {now})"
            elif row["status"] == "PaymentInitiated":
                session = provider["sessions"][row["session"]]
                if session["pi_status"] == "processing":
                    continue  # money on its way: the order waits for it, as it should
                pay_by = row["session_expires"]
                assert pay_by + slack > now, (
                    f"order {oid} is PaymentInitiated past its session's expiry {pay_by} (now {now}; session {session})"
                )
