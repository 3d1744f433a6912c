"""place_order, the one checkout transaction, against the real database: no oversell under
concurrency, all-or-nothing on a shortfall, no lock-order deadlock, and stock conservation."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from factories import cart_with, catalog_rows, on_hand, transitioned
from shop.domain.order import LIVE, OrderStatus
from shop.domain.order import Transition as T
from shop.extensions import db
from shop.models import Cart, Order, OrderLine, OutboxDelivery, OutboxEvent, ScheduledCommand, Variant
from shop.orders.cancel import cancel_order
from shop.orders.checkout import place_order
from shop.outbox.dispatch import run_delivery
from support import run_threads


def count(model) -> int:
    return db.session.execute(select(func.count()).select_from(model)).scalar_one()


def test_fifty_concurrent_checkouts_of_ten_in_stock_make_exactly_ten_orders(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(10)
        carts = [cart_with([(variant, 1)]) for _ in range(50)]

    results, errors = run_threads(
        # Fifty customers (browsers and addresses): the unpaid-order limit is not what this counts.
        fresh_app,
        carts,
        lambda c: place_order(cart_id=c[0], browser_id=c[1], email=f"{c[1]}@example.com"),
    )

    assert errors == [None] * 50, [repr(e) for e in errors if e]
    outcomes = Counter("placed" if r.ok else r.code for r in results)
    assert outcomes == {"placed": 10, "out_of_stock": 40}
    for refused in (r for r in results if not r.ok):
        assert refused.shortages == [
            {
                "variant_id": variant,
                "sku": refused.shortages[0]["sku"],
                "name": "Product 1 – V0",
                "requested": 1,
                "available": 0,
            }
        ]
    with fresh_app.app_context():
        assert on_hand(variant) == 0
        assert count(Order) == 10
        assert db.session.execute(select(func.sum(OrderLine.quantity))).scalar_one() == 10
        assert count(OutboxEvent) == 10  # one OrderPlaced per order, none from the refused forty
        assert count(ScheduledCommand) == 10
        closed = db.session.execute(select(func.count()).where(Cart.status == "ordered")).scalar_one()
        assert closed == 10


def test_an_order_with_one_short_line_leaves_nothing_behind_and_names_the_short_item(fresh_app):
    with fresh_app.app_context():
        plenty, scarce = catalog_rows(20, 2)
        cart_id, browser = cart_with([(plenty, 5), (scarce, 3)])
        sku = db.session.get(Variant, scarce).sku

        result = place_order(cart_id=cart_id, browser_id=browser, email="ann@example.com")

        assert not result.ok and result.code == "out_of_stock"
        assert result.shortages == [
            {"variant_id": scarce, "sku": sku, "name": "Product 1 – V1", "requested": 3, "available": 2}
        ]
        db.session.remove()
        # The plenty line was decremented before the short one was found: it must be rolled back too.
        assert (on_hand(plenty), on_hand(scarce)) == (20, 2)
        assert count(Order) == count(OrderLine) == count(OutboxEvent) == count(OutboxDelivery) == 0
        assert count(ScheduledCommand) == 0
        assert db.session.get(Cart, cart_id).status == "open"  # the customer can fix the cart and retry


def test_a_placed_order_takes_prices_from_the_database_and_arms_its_deadline_in_the_same_commit(fresh_app):
    with fresh_app.app_context():
        a, b = catalog_rows(5, 5, price=1000)
        cart_id, browser = cart_with([(b, 2), (a, 1)])
        placed = place_order(cart_id=cart_id, browser_id=browser, email="ann@example.com")
        assert placed.ok
        db.session.remove()
        order = db.session.get(Order, placed.order_id)
        assert (order.status, order.total, order.version) == ("PendingPayment", 1000 + 2 * 1001, 1)
        assert [(l.variant_id, l.quantity, l.unit_price) for l in order.lines] == [(a, 1, 1000), (b, 2, 1001)]
        assert (on_hand(a), on_hand(b)) == (4, 3)
        event = db.session.execute(select(OutboxEvent)).scalar_one()
        assert event.name == "OrderPlaced" and event.payload["reference"] == placed.reference
        deadline = db.session.execute(select(ScheduledCommand)).scalar_one()
        assert (deadline.kind, deadline.order_id) == ("expire_unpaid_order", order.id)
        assert db.session.get(Cart, cart_id).status == "ordered"
        again = place_order(cart_id=cart_id, browser_id=browser, email="ann@example.com")
        assert not again.ok and again.code in {"cart_closed", "empty_cart"} or again.code == "cart_closed"
        assert count(Order) == 1 and (on_hand(a), on_hand(b)) == (4, 3)


def test_checkouts_of_the_same_two_variants_in_opposite_cart_order_never_deadlock(fresh_app, monkeypatch):
    # Each checkout holds its first stock row lock while it takes the second (widened here by a
    # failpoint): only the fixed variant order keeps two such checkouts from waiting on each other.
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "place_order.after_decrement=sleep:0.004")
    rounds, clients = 6, 12
    with fresh_app.app_context():
        a, b = catalog_rows(1000, 1000)
        jobs = [
            [cart_with([(a, 1), (b, 2)] if i % 2 else [(b, 2), (a, 1)]) for i in range(clients)] for _ in range(rounds)
        ]

    placed = 0
    for carts in jobs:  # every round releases all clients at once
        results, errors = run_threads(
            fresh_app, carts, lambda c: place_order(cart_id=c[0], browser_id=c[1], email=f"{c[1]}@example.com")
        )
        assert errors == [None] * clients, [repr(e) for e in errors if e]
        assert all(r.ok for r in results), [r for r in results if not r.ok]
        placed += len(results)

    with fresh_app.app_context():
        assert count(Order) == placed == rounds * clients
        assert (on_hand(a), on_hand(b)) == (1000 - placed, 1000 - 2 * placed)


# -- stock conservation, as a property ---------------------------------------------------------


def _conservation(variant_ids, initial):
    """initial = on hand + held by live orders + sold to paid orders (+ cancelled but not yet
    restored, which must be nothing once compensation has run)."""
    held = Counter()
    rows = db.session.execute(
        select(OrderLine.variant_id, OrderLine.quantity, Order.status, Order.inventory_restored)
        .join(Order, Order.id == OrderLine.order_id)
        .where(OrderLine.variant_id.in_(variant_ids))
    ).all()
    for variant_id, quantity, status, restored in rows:
        if status in {s.value for s in LIVE} or status == OrderStatus.PAID.value:
            held[variant_id] += quantity
        else:
            assert status == OrderStatus.CANCELLED.value and restored, "a cancelled order kept its stock"
    for variant_id in variant_ids:
        assert on_hand(variant_id) >= 0
        assert initial[variant_id] == on_hand(variant_id) + held[variant_id], variant_id


def _restore_deliveries(order_id):
    return (
        db.session.execute(
            select(OutboxDelivery.id).where(
                OutboxDelivery.order_id == order_id, OutboxDelivery.handler == "restore_inventory"
            )
        )
        .scalars()
        .all()
    )


_quantity = st.integers(1, 4)
_step = st.one_of(
    st.tuples(st.just("checkout"), st.lists(st.tuples(st.integers(0, 2), _quantity), min_size=1, max_size=3)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("cancel_stale"), st.integers(0, 20)),
    st.tuples(st.just("pay"), st.integers(0, 20)),
    st.tuples(st.just("fail_payment"), st.integers(0, 20)),
    st.tuples(st.just("compensate"), st.integers(0, 20)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stocks=st.lists(st.integers(0, 6), min_size=3, max_size=3), steps=st.lists(_step, max_size=14))
def test_any_sequence_of_checkouts_payments_and_cancels_conserves_stock(fresh_ctx, stocks, steps):
    variants = catalog_rows(*stocks)  # fresh rows per example: examples never see each other
    initial = dict(zip(variants, stocks, strict=True))
    orders: list[int] = []

    def pick(i):
        return orders[i % len(orders)] if orders else None

    for kind, arg in steps:
        if kind == "checkout":
            merged = Counter()
            for index, quantity in arg:
                merged[variants[index]] += quantity
            cart_id, browser = cart_with(sorted(merged.items(), reverse=True))
            before = {v: on_hand(v) for v in variants}
            result = place_order(cart_id=cart_id, browser_id=browser, email=f"{browser}@example.com")
            if result.ok:
                orders.append(result.order_id)
            elif any(q > fresh_ctx.config["MAX_LINE_QUANTITY"] for q in merged.values()):
                assert result.code == "too_many_of_one"  # refused before stock is looked at
                assert {v: on_hand(v) for v in variants} == before
            else:
                assert result.code == "out_of_stock"
                assert any(before[v] < q for v, q in merged.items())
                assert {v: on_hand(v) for v in variants} == before
        elif (order_id := pick(arg)) is None:
            continue
        elif kind in ("cancel", "cancel_stale"):
            order = db.session.get(Order, order_id)
            status, version = order.status, order.version
            outcome = cancel_order(order_id, version - 1 if kind == "cancel_stale" else version)
            db.session.remove()
            if kind == "cancel_stale":
                assert outcome.status == "conflict"
                assert db.session.get(Order, order_id).status == status
            else:
                assert outcome.status == ("cancelled" if status in {s.value for s in LIVE} else "refused")
        elif kind in ("pay", "fail_payment"):
            # Through the order store, as the payment use cases save these transitions.
            steps = [(T.START_PAYMENT, lambda o: o.start_payment(f"cs_{order_id}_{o.version}"))]
            if kind == "pay":
                steps.append((T.MARK_PAID, lambda o: o.mark_paid(o.payment_session_id or "cs_x", o.total, o.currency)))
            else:
                steps.append((T.MARK_PAYMENT_FAILED, lambda o: o.mark_payment_failed("card_declined")))
            transitioned(order_id, *steps, allowed_only=False)
            db.session.remove()
        elif kind == "compensate":  # redeliver every restore for one order: stock comes back once
            for delivery_id in _restore_deliveries(order_id):
                run_delivery(delivery_id)
                db.session.execute(
                    OutboxDelivery.__table__.update()
                    .where(OutboxDelivery.id == delivery_id)
                    .values(status="pending", attempts=0, claimed_by=None, claimed_until=None)
                )
                db.session.commit()
                run_delivery(delivery_id)

    # Quiet system: every outstanding compensation has run.
    for order_id in orders:
        for delivery_id in _restore_deliveries(order_id):
            run_delivery(delivery_id)
    db.session.remove()
    _conservation(variants, initial)
