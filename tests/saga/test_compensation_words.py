"""What the compensation (saga.inventory.restore_inventory) tells an operator: its log line for
each outcome, naming the order (docs/REFERENCE.md, Logs: `order_ref` learned where an order is
read), and the warning a refusal leaves, in words with its code."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import delete, select, update

from compensation_support import cancel, on_hand, order, warnings
from factories import place_order_for, seed_catalog_rows
from shop import logs
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.events import OrderCancelled
from shop.domain.order import CANCELLED_BY_CUSTOMER
from shop.domain.restoration import MAX_ON_HAND
from shop.extensions import db
from shop.models import InventoryItem
from shop.outbox import uow
from shop.saga.inventory import restore_inventory, restore_inventory_now


@pytest.fixture
def catalog(fresh_ctx):
    return seed_catalog_rows()


def said(caplog, level) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "shop.saga" and r.levelno == level]


def test_a_restore_names_the_order_and_what_it_gave_back(catalog, caplog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = place_order_for({a5: 3, sand: 2}).order_id
    cancel(order_id)
    reference = order(order_id).reference
    with caplog.at_level(logging.INFO, logger="shop.saga"), logs.scope(job_id="job-restore"):
        assert restore_inventory_now(order_id) == "restored"
        assert logs.current()["order_ref"] == reference
    assert said(caplog, logging.INFO) == [f"restore_inventory: order {reference} restored {{{a5}: 3, {sand}: 2}}"]


def test_a_restore_of_an_order_that_is_not_cancelled_says_its_state(catalog, caplog):
    order_id = place_order_for({catalog["NB-A5-DOT"]: 1}).order_id
    reference = order(order_id).reference
    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        assert restore_inventory_now(order_id) == "not_cancelled"
    assert said(caplog, logging.WARNING) == [
        f"restore_inventory: order {reference} is PendingPayment, not Cancelled; nothing restored"
    ]


def test_a_restore_of_an_order_that_no_longer_exists_says_so(catalog, caplog):
    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        assert restore_inventory_now(987_654) == "gone"
    assert said(caplog, logging.WARNING) == ["restore_inventory: order 987654 from OrderCancelled no longer exists"]


def test_a_refused_restore_leaves_one_warning_in_words_with_every_unit_it_held_back(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = place_order_for({a5: 3, sand: 2}).order_id
    cancel(order_id)
    db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == a5).values(on_hand=MAX_ON_HAND - 1))
    db.session.commit()
    assert restore_inventory_now(order_id) == "refused"
    [warning] = warnings(order_id)
    assert (warning.variant_id, warning.quantity, warning.state) == (None, 5, "open")
    assert warning.reason == (
        f"nothing given back for this order, because variant {a5}'s stock would go over the maximum an "
        f"inventory row holds (stock_would_overflow:variant={a5}). Fix the stock by hand and resolve, or fix "
        "the cause and retry the restore."
    )
    assert (on_hand(a5), on_hand(sand), order(order_id).inventory_restored) == (MAX_ON_HAND - 1, 10, False)


def test_a_line_without_an_inventory_row_leaves_a_warning_in_words_and_the_rest_comes_back(catalog, caplog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = place_order_for({a5: 3, sand: 2}).order_id
    cancel(order_id)
    reference = order(order_id).reference
    db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id == sand))
    db.session.commit()
    started = utcnow()
    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        assert restore_inventory_now(order_id) == "restored"
    [warning] = warnings(order_id)
    assert (warning.variant_id, warning.quantity) == (sand, 2)
    assert warning.reason == "no inventory row for this variant; quantity not restored"
    assert said(caplog, logging.WARNING) == [
        f"restore_inventory: order {reference} (OrderCancelled): variant {sand} has no inventory row, "
        "2 unit(s) not restored"
    ]
    # The row that came back is stamped with the restore's time.
    row = db.session.execute(select(InventoryItem).where(InventoryItem.variant_id == a5)).scalar_one()
    assert (row.on_hand, started <= as_utc(row.updated_at) <= utcnow()) == (40, True)
    db.session.rollback()


def test_what_a_restore_records_carries_the_time_of_the_delivery_that_ran_it(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = place_order_for({a5: 3, sand: 2}).order_id
    cancel(order_id)
    db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id == sand))
    db.session.commit()
    when = utcnow() - timedelta(hours=1)
    with uow.transaction():
        assert restore_inventory(OrderCancelled(order_id, CANCELLED_BY_CUSTOMER), when) == "restored"
    [warning] = warnings(order_id)
    assert as_utc(warning.created_at) == when
    row = db.session.execute(select(InventoryItem).where(InventoryItem.variant_id == a5)).scalar_one()
    assert (row.on_hand, as_utc(row.updated_at)) == (40, when)
    db.session.rollback()


def test_a_restore_refused_for_two_lines_names_both_in_one_warning_and_its_log_at_the_deliverys_time(catalog, caplog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id = place_order_for({a5: 3, sand: 2}).order_id
    cancel(order_id)
    reference = order(order_id).reference
    full = update(InventoryItem).where(InventoryItem.variant_id.in_([a5, sand])).values(on_hand=MAX_ON_HAND - 1)
    db.session.execute(full)
    db.session.commit()
    when = utcnow() - timedelta(hours=1)

    with caplog.at_level(logging.WARNING, logger="shop.saga"), uow.transaction():
        assert restore_inventory(OrderCancelled(order_id, CANCELLED_BY_CUSTOMER), when) == "refused"

    overflow = "variant {v}'s stock would go over the maximum an inventory row holds (stock_would_overflow:variant={v})"
    because = "; ".join(overflow.format(v=v) for v in sorted([a5, sand]))
    reason = (
        f"nothing given back for this order, because {because}. Fix the stock by hand and resolve, or fix the cause "
        "and retry the restore."
    )
    [warning] = warnings(order_id)
    assert (warning.reason, warning.variant_id, warning.quantity, as_utc(warning.created_at)) == (reason, None, 5, when)
    assert said(caplog, logging.WARNING) == [f"restore_inventory: order {reference} (OrderCancelled): {reason}"]
    assert (on_hand(a5), on_hand(sand), order(order_id).inventory_restored) == (MAX_ON_HAND - 1, MAX_ON_HAND - 1, False)
