"""A paid order's stock given back with an operator's refund (saga.inventory.restock_paid_order,
docs/REFERENCE.md, `POST /console/orders/<ref>/refund` with `restock`, and the guarantee *Stock
comes back once*): once, through the compensation's own marker, and what it answers the operator
in words."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import delete, select, update

from compensation_support import on_hand, order, warnings
from factories import place_order_for, seed_catalog_rows, transitioned
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.order import Transition as T
from shop.domain.restoration import MAX_ON_HAND
from shop.extensions import db
from shop.models import InventoryItem
from shop.outbox import uow
from shop.saga.inventory import RestoreOutcome, restock_paid_order


@pytest.fixture
def catalog(fresh_ctx):
    return seed_catalog_rows()


def paid(items) -> int:
    order_id = place_order_for(items).order_id
    transitioned(
        order_id,
        (T.START_PAYMENT, lambda o: o.start_payment("cs_test_restock", "https://pay.example/cs_test_restock")),
        (T.MARK_PAID, lambda o: o.mark_paid("cs_test_restock", 1, "usd")),
    )
    return order_id


def restock(order_id: int):
    with uow.transaction():
        return restock_paid_order(order_id, utcnow())


def test_a_paid_order_is_restocked_once_and_says_what_came_back(catalog, caplog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = paid({a5: 3, sand: 2})
    reference = order(order_id).reference
    with caplog.at_level(logging.INFO, logger="shop.saga"):
        assert restock(order_id) == (RestoreOutcome.RESTORED, f"+3 to variant {a5}, +2 to variant {sand}")
    assert (on_hand(a5), on_hand(sand)) == (40, 12)
    assert order(order_id).inventory_restored is True
    [line] = [r.getMessage() for r in caplog.records if r.name == "shop.saga"]
    assert line == f"restock_paid_order: order {reference} restocked {{{a5}: 3, {sand}: 2}} with a refund"


def test_a_second_restock_of_the_order_is_refused_and_gives_nothing_back(catalog):
    a5 = catalog["NB-A5-DOT"]
    order_id = paid({a5: 3})
    assert restock(order_id)[0] is RestoreOutcome.RESTORED
    assert restock(order_id) == (RestoreOutcome.INVENTORY_ALREADY_RESTORED, "this order's stock was already restored")
    assert on_hand(a5) == 40


def test_an_order_that_is_not_paid_is_not_restocked(catalog):
    a5 = catalog["NB-A5-DOT"]
    order_id = place_order_for({a5: 3}).order_id
    assert restock(order_id) == (RestoreOutcome.ORDER_NOT_PAID, "only a paid order is restocked with a refund")
    assert (on_hand(a5), order(order_id).inventory_restored) == (37, False)


def test_an_order_that_does_not_exist_is_gone(catalog):
    assert restock(987_654) == (RestoreOutcome.GONE, "the order no longer exists")


def test_a_restock_that_would_overflow_a_row_is_refused_in_words_and_changes_nothing(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = paid({a5: 3, sand: 2})
    db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == a5).values(on_hand=MAX_ON_HAND - 1))
    db.session.commit()
    assert restock(order_id) == (
        RestoreOutcome.REFUSED,
        f"variant {a5}'s stock would go over the maximum an inventory row holds (stock_would_overflow:variant={a5})",
    )
    assert (on_hand(a5), on_hand(sand), order(order_id).inventory_restored) == (MAX_ON_HAND - 1, 10, False)


def test_a_restock_refused_for_two_lines_names_both(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = paid({a5: 3, sand: 2})
    full = update(InventoryItem).where(InventoryItem.variant_id.in_([a5, sand])).values(on_hand=MAX_ON_HAND - 1)
    db.session.execute(full)
    db.session.commit()
    overflow = "variant {v}'s stock would go over the maximum an inventory row holds (stock_would_overflow:variant={v})"
    assert restock(order_id) == (RestoreOutcome.REFUSED, "; ".join(overflow.format(v=v) for v in sorted([a5, sand])))
    assert order(order_id).inventory_restored is False


def test_a_restock_gives_back_the_lines_with_an_inventory_row_and_warns_of_the_one_without(catalog, caplog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = paid({a5: 3, sand: 2})
    reference = order(order_id).reference
    db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id == sand))
    db.session.commit()

    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        assert restock(order_id) == (RestoreOutcome.RESTORED, f"+3 to variant {a5}")

    assert (on_hand(a5), order(order_id).inventory_restored) == (40, True)
    [warning] = warnings(order_id)
    assert (warning.variant_id, warning.quantity) == (sand, 2)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"restore_inventory: order {reference} (OrderCancelled): variant {sand} has no inventory row, "
        "2 unit(s) not restored"
    ]


def test_a_restock_stamps_the_stock_with_the_refunds_time_and_leaves_the_paid_orders_age(catalog):
    a5 = catalog["NB-A5-DOT"]
    order_id = paid({a5: 3})
    paid_at = as_utc(order(order_id).updated_at)
    when = utcnow() - timedelta(hours=1)
    with uow.transaction():
        assert restock_paid_order(order_id, when)[0] is RestoreOutcome.RESTORED
    assert as_utc(order(order_id).updated_at) == paid_at  # not a state change: its age counts from the payment
    row = db.session.execute(select(InventoryItem).where(InventoryItem.variant_id == a5)).scalar_one()
    assert (row.on_hand, as_utc(row.updated_at)) == (40, when)
    db.session.rollback()
