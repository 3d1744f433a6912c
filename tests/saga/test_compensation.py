"""The compensation for OrderCancelled (saga.inventory.restore_inventory): a cancelled order's
stock comes back exactly once, whatever redelivers or races, and what cannot come back is
recorded instead of lost. The pure restoration arithmetic it relies on: tests/domain/test_restoration.py."""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta

import pytest
from sqlalchemy import delete, insert, update
from sqlalchemy.orm.exc import StaleDataError

from compensation_support import cancel, on_hand, order, placed_and_cancelled, restore_delivery, warnings
from factories import force_order, place_order_for, seed_catalog_rows
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.events import OrderCancelled
from shop.domain.restoration import MAX_ON_HAND
from shop.extensions import db
from shop.models import InventoryItem, OutboxDelivery, OutboxEvent
from shop.outbox import uow
from shop.outbox.dispatch import run_delivery
from shop.saga.inventory import RestoreOutcome, restore_inventory, restore_inventory_now

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgres")


@pytest.fixture
def catalog(fresh_ctx):
    return seed_catalog_rows()


def test_a_cancelled_order_gets_its_stock_back_through_its_delivery(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    assert (on_hand(a5), on_hand(sand)) == (37, 10)
    assert order(order_id).inventory_restored is False

    assert run_delivery(delivery_id) == "done"

    assert (on_hand(a5), on_hand(sand)) == (40, 12)
    assert order(order_id).inventory_restored is True
    row = restore_delivery(order_id)
    assert (row.status, row.attempts, row.claimed_until) == ("done", 1, None)


def test_a_redelivered_cancellation_restores_stock_once(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    assert run_delivery(delivery_id) == "done"

    # The same job again (a duplicate announcement, the relay racing the post-commit enqueue):
    # the row is done, the claim refuses it.
    assert run_delivery(delivery_id) == "skipped"
    # A second delivery row carrying the same OrderCancelled (the event written twice): the claim
    # cannot help here, the marker must.
    original = restore_delivery(order_id).event
    now = utcnow()
    event_id = db.session.execute(
        insert(OutboxEvent)
        .values(order_id=order_id, name=original.name, payload=original.payload, created_at=now)
        .returning(OutboxEvent.id)
    ).scalar_one()
    second = db.session.execute(
        insert(OutboxDelivery)
        .values(
            event_id=event_id,
            handler="restore_inventory",
            order_id=order_id,
            status="pending",
            attempts=0,
            max_attempts=5,
            next_attempt_at=now,
            created_at=now,
            updated_at=now,
        )
        .returning(OutboxDelivery.id)
    ).scalar_one()
    db.session.commit()
    assert run_delivery(second) == "done"
    # And the very same delivery row handed back to a worker (its "done" lost to an operator's
    # reset): the marker again.
    db.session.execute(
        update(OutboxDelivery)
        .where(OutboxDelivery.id == delivery_id)
        .values(status="pending", attempts=0, next_attempt_at=now)
    )
    db.session.commit()
    assert run_delivery(delivery_id) == "done"

    assert (on_hand(a5), on_hand(sand)) == (40, 12)
    assert warnings(order_id) == []


def test_restore_inventory_called_twice_restores_once(catalog):
    a5 = catalog["NB-A5-DOT"]
    order_id = place_order_for({a5: 4}).order_id
    cancel(order_id)
    assert restore_inventory_now(order_id) == "restored"
    assert restore_inventory_now(order_id) == "already_restored"
    assert on_hand(a5) == 40
    assert order(order_id).inventory_restored is True


def test_the_marker_is_stamped_with_the_time_the_restore_ran_at(catalog):
    # The order's updated_at says when its stock came back: the time its delivery ran at (a drain's
    # claim time, a clock set by hand), not whenever the statement happened to be sent.
    a5 = catalog["NB-A5-DOT"]
    order_id = place_order_for({a5: 4}).order_id
    cancel(order_id)
    ran_at = utcnow() - timedelta(minutes=7)
    with uow.transaction():
        assert restore_inventory(OrderCancelled(order_id, "customer"), ran_at) is RestoreOutcome.RESTORED
    restored = order(order_id)
    assert restored.inventory_restored is True
    assert as_utc(restored.updated_at) == ran_at


def test_an_operators_retry_of_a_cancel_saved_without_a_reason_says_so_in_the_reason(catalog):
    # A cancel saved by an older release left why empty: the compensation fills it in from its
    # event, and an operator's retry has only its own words to give.
    a5 = catalog["NB-A5-DOT"]
    order_id = place_order_for({a5: 4}).order_id
    cancel(order_id)
    force_order(order_id, cancel_reason=None)
    assert restore_inventory_now(order_id) == "restored"
    assert order(order_id).cancel_reason == "operator retry"
    assert on_hand(a5) == 40


def test_restore_of_an_order_that_is_not_cancelled_changes_nothing(catalog):
    a5 = catalog["NB-A5-DOT"]
    order_id = place_order_for({a5: 4}).order_id
    assert restore_inventory_now(order_id) == "not_cancelled"
    assert on_hand(a5) == 36
    assert order(order_id).inventory_restored is False


@pytest.mark.skipif(not ON_POSTGRES, reason="row locks and concurrent transactions need PostgreSQL")
def test_twenty_concurrent_deliveries_of_one_cancellation_restore_once(fresh_app, monkeypatch):
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        order_id = place_order_for({a5: 3}).order_id
        cancel(order_id)
        before = on_hand(a5)
        db.session.remove()
    # The winner holds its flushed marker (and the order row's lock) for a while before it
    # commits, so the others have all loaded the order with the marker unset: only the version
    # check on the order row can stop them.
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "restore_inventory.after_marker_flush=sleep:0.5")
    barrier = threading.Barrier(20)
    results, lock = [], threading.Lock()

    def deliver():
        with fresh_app.app_context():
            try:
                barrier.wait()
                outcome = restore_inventory_now(order_id)
            except Exception as exc:  # noqa: BLE001 - the loser's exception is the result
                outcome = exc
            finally:
                db.session.remove()
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=deliver) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    monkeypatch.delenv("BACKSTOP_FAILPOINTS")

    assert len(results) == 20
    assert results.count("restored") == 1
    losers = [r for r in results if r != "restored"]
    assert all(isinstance(r, StaleDataError) or r == "already_restored" for r in losers), losers
    assert sum(isinstance(r, StaleDataError) for r in losers) >= 10, losers  # the race really happened
    with fresh_app.app_context():
        assert on_hand(a5) == before + 3
        assert order(order_id).inventory_restored is True
        # A loser's retry is an ordinary redelivery: it finds the marker and does nothing.
        assert restore_inventory_now(order_id) == "already_restored"
        assert on_hand(a5) == before + 3
        db.session.remove()


def test_a_soft_deleted_inventory_row_gets_its_stock_back(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == sand).values(deleted_at=utcnow()))
    db.session.commit()

    assert run_delivery(delivery_id) == "done"

    assert (on_hand(a5), on_hand(sand)) == (40, 12)
    assert warnings(order_id) == []
    assert order(order_id).inventory_restored is True


def test_a_missing_inventory_row_gives_one_warning_and_the_marker_still_commits(catalog, caplog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    reference = order(order_id).reference
    db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id == sand))
    db.session.commit()

    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        assert run_delivery(delivery_id) == "done"
    # A redelivery must neither re-apply the matched line nor warn twice.
    assert restore_inventory_now(order_id) == "already_restored"

    assert on_hand(a5) == 40
    assert order(order_id).inventory_restored is True
    [warning] = warnings(order_id)
    assert (warning.variant_id, warning.quantity, warning.state) == (sand, 2, "open")
    assert "no inventory row" in warning.reason
    lines = [r for r in caplog.records if r.levelno == logging.WARNING and reference in r.getMessage()]
    assert len(lines) == 1 and "OrderCancelled" in lines[0].getMessage()


def test_an_invariant_refusal_saves_a_warning_and_nothing_else(catalog, caplog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    reference = order(order_id).reference
    # Someone set the stock so high that giving back 3 would overflow the column.
    db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == a5).values(on_hand=MAX_ON_HAND - 1))
    db.session.commit()

    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        assert run_delivery(delivery_id) == "done"  # settled: retrying would only refuse again

    assert (on_hand(a5), on_hand(sand)) == (MAX_ON_HAND - 1, 10)  # not even the valid line
    assert order(order_id).inventory_restored is False
    [warning] = warnings(order_id)
    assert f"stock_would_overflow:variant={a5}" in warning.reason
    assert any(r.levelno == logging.WARNING and reference in r.getMessage() for r in caplog.records)
    row = restore_delivery(order_id)
    assert (row.status, row.attempts) == ("done", 1)

    # The operator fixes the cause and retries: now it restores, once.
    db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == a5).values(on_hand=100))
    db.session.commit()
    assert restore_inventory_now(order_id) == "restored"
    assert (on_hand(a5), on_hand(sand)) == (103, 12)
    assert order(order_id).inventory_restored is True


def test_a_failed_restore_commits_nothing_and_its_retry_restores_once(catalog, monkeypatch):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "restore_inventory.after_marker_flush=raise")
    started = utcnow()
    assert run_delivery(delivery_id, now=started) == "retry"
    assert (on_hand(a5), on_hand(sand)) == (37, 10)
    assert order(order_id).inventory_restored is False
    row = restore_delivery(order_id)
    assert row.status == "pending" and "failpoint" in row.last_error

    monkeypatch.delenv("BACKSTOP_FAILPOINTS")
    assert run_delivery(delivery_id, now=started + timedelta(seconds=5)) == "done"
    assert (on_hand(a5), on_hand(sand)) == (40, 12)
