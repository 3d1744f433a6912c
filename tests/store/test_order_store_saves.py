"""What a saved transition leaves behind besides its guarded UPDATE (shop/store/order_store.py,
`save`; docs/REFERENCE.md, Order states): the time it was given, the late-money watch a cancel
starts, the snapshot at its new version with its events spent, and no stale mapped order in the
session."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from factories import force_order, place_order_for, seed_catalog_rows
from shop import clock as shop_clock
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.order import CANCELLED_BY_CUSTOMER, OrderStatus, Transition
from shop.extensions import db
from shop.models import Order, OutboxEvent
from shop.store import order_store
from support import FakeClock

S = OrderStatus


def _in(order_id: int, status: OrderStatus, **values):
    force_order(order_id, status=status.value, payment_session_id="cs_saves", **values)
    snapshot = order_store.read(order_id)
    db.session.rollback()
    return snapshot


def _column(order_id: int, column):
    db.session.expire_all()
    value = db.session.execute(select(column).where(Order.id == order_id)).scalar_one()
    db.session.rollback()
    return value


@pytest.mark.parametrize(
    "status,transition,move",
    [
        (S.PAYMENT_INITIATED, Transition.MARK_PAID, lambda o: o.mark_paid("cs_saves", 1, "usd")),
        (S.CANCELLED, Transition.MARK_INVENTORY_RESTORED, lambda o: o.mark_inventory_restored()),
    ],
)
def test_a_transition_that_stamps_the_order_writes_the_time_it_was_given(order_id, status, transition, move):
    snapshot = _in(order_id, status)
    when = utcnow() - timedelta(hours=3)
    order_store.save(snapshot, transition, move(snapshot).events, now=when)
    db.session.commit()
    assert as_utc(_column(order_id, Order.updated_at)) == when


def test_a_cancel_without_a_settling_payment_starts_the_watch_when_it_is_told(order_id):
    snapshot = _in(order_id, S.PAYMENT_INITIATED)
    watch_from = utcnow() - timedelta(minutes=7)
    order_store.save(snapshot, Transition.CANCEL, snapshot.cancel(CANCELLED_BY_CUSTOMER).events, watch_from=watch_from)
    db.session.commit()
    assert as_utc(_column(order_id, Order.late_money_watch_since)) == watch_from


def test_a_saved_snapshot_is_at_the_new_version_with_its_events_written_once(order_id):
    snapshot = _in(order_id, S.PAYMENT_INITIATED)
    events_before = db.session.execute(
        select(func.count()).select_from(OutboxEvent).where(OutboxEvent.order_id == order_id)
    ).scalar_one()
    result = snapshot.cancel(CANCELLED_BY_CUSTOMER)
    assert len(result.events) == 1  # the transition hands its events to the save, the one way they travel
    order_store.save(snapshot, Transition.CANCEL, result.events, now=utcnow())
    db.session.commit()
    written = db.session.execute(
        select(OutboxEvent.name).where(OutboxEvent.order_id == order_id).order_by(OutboxEvent.id)
    ).scalars()
    assert list(written)[events_before:] == ["OrderCancelled"]
    # The snapshot goes on from its new version: its next transition saves.
    snapshot.mark_inventory_restored()
    order_store.save(snapshot, Transition.MARK_INVENTORY_RESTORED, now=utcnow())
    db.session.commit()
    assert _column(order_id, Order.inventory_restored) is True


def test_a_mapped_order_the_session_holds_reads_the_saved_row_afterwards(order_id):
    mapped = db.session.get(Order, order_id)
    assert mapped.status == S.PENDING_PAYMENT
    snapshot = order_store.read(order_id)
    order_store.save(snapshot, Transition.CANCEL, snapshot.cancel(CANCELLED_BY_CUSTOMER).events, now=utcnow())
    # Same transaction, no expire by the caller: the session's mapped order is not left stale.
    assert (mapped.status, mapped.version) == (S.CANCELLED, snapshot.version)
    db.session.rollback()


def test_a_transitions_events_are_written_at_the_time_it_was_saved(order_id):
    snapshot = _in(order_id, S.PAYMENT_INITIATED)
    when = utcnow() - timedelta(hours=2)
    order_store.save(snapshot, Transition.CANCEL, snapshot.cancel(CANCELLED_BY_CUSTOMER).events, now=when)
    db.session.commit()
    [created] = db.session.execute(
        select(OutboxEvent.created_at).where(OutboxEvent.order_id == order_id, OutboxEvent.name == "OrderCancelled")
    ).scalars()
    db.session.rollback()
    assert as_utc(created) == when


def test_a_transition_saves_only_its_own_order_not_another_at_the_same_version_and_state(order_id):
    other = place_order_for({next(iter(sorted(seed_catalog_rows().values()))): 1}).order_id
    db.session.remove()
    snapshot, bystander = _in(order_id, S.PAYMENT_INITIATED), _in(other, S.PAYMENT_INITIATED)
    assert (snapshot.version, bystander.status) == (bystander.version, S.PAYMENT_INITIATED)
    order_store.save(snapshot, Transition.CANCEL, snapshot.cancel(CANCELLED_BY_CUSTOMER).events, now=utcnow())
    db.session.commit()
    assert _column(order_id, Order.status) == S.CANCELLED
    assert (_column(other, Order.status), _column(other, Order.version)) == (S.PAYMENT_INITIATED, bystander.version)


def test_a_transition_saved_without_a_time_is_stamped_with_the_clocks(order_id):
    snapshot = _in(order_id, S.PAYMENT_INITIATED)
    clock = FakeClock(utcnow() - timedelta(days=2))
    shop_clock.use(clock)
    order_store.save(snapshot, Transition.MARK_PAID, snapshot.mark_paid("cs_saves", 1, "usd").events)
    db.session.commit()
    [created] = db.session.execute(
        select(OutboxEvent.created_at).where(OutboxEvent.order_id == order_id, OutboxEvent.name == "OrderPaid")
    ).scalars()
    db.session.rollback()
    assert as_utc(_column(order_id, Order.updated_at)) == as_utc(created) == clock.now()
