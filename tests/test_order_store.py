"""The order store's contract (shop/store/orders.py): every transition is saved by one
version-guarded UPDATE and refused the same way when the order moved meanwhile (`LostRace`,
nothing written, not even its events); bookkeeping notes never bump the version nor move the
order's age; and no module but the store writes the `orders` table."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm.exc import StaleDataError

from factories import place_order_for, seed_catalog_rows
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.order import ALLOWED, CANCELLED_BY_CUSTOMER, OrderStatus
from shop.extensions import db
from shop.models import Order, OutboxEvent
from shop.store import orders

S = OrderStatus
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def order_id(fresh_ctx):
    skus = seed_catalog_rows()
    oid = place_order_for({next(iter(sorted(skus.values()))): 1}).order_id
    db.session.remove()
    return oid


def _force(order_id: int, **values) -> None:
    """The test's own hand on the row: move it as another writer would have."""
    db.session.execute(update(Order.__table__).where(Order.__table__.c.id == order_id).values(**values))
    db.session.commit()


def _row(order_id: int):
    db.session.expire_all()
    row = db.session.execute(
        select(
            Order.status,
            Order.version,
            Order.updated_at,
            Order.inventory_restored,
            Order.payment_processing_at,
            Order.provider_next_check_at,
        ).where(Order.id == order_id)
    ).one()
    db.session.rollback()
    return row


def _events(order_id: int) -> int:
    count = db.session.execute(
        select(func.count()).select_from(OutboxEvent).where(OutboxEvent.order_id == order_id)
    ).scalar_one()
    db.session.rollback()
    return count


# Each transition the store saves: the state the order is in before it, and the domain's move on a snapshot.
TRANSITIONS = {
    "start_payment": (S.PENDING_PAYMENT, lambda o: o.start_payment("cs_race", "https://pay.example/cs_race")),
    "mark_paid": (S.PAYMENT_INITIATED, lambda o: o.mark_paid("cs_race", 1, "usd")),
    "adopt_and_pay": (S.PAYMENT_FAILED, lambda o: (o.start_payment("cs_race"), o.mark_paid("cs_race", 1, "usd"))[1]),
    "mark_payment_failed": (S.PAYMENT_INITIATED, lambda o: o.mark_payment_failed("declined")),
    "cancel": (S.PAYMENT_INITIATED, lambda o: o.cancel(CANCELLED_BY_CUSTOMER)),
    "mark_inventory_restored": (S.CANCELLED, lambda o: o.mark_inventory_restored()),
}


def test_every_transition_the_store_saves_is_pinned_here():
    assert set(TRANSITIONS) == set(orders.TRANSITIONS)


def _snapshot_in(order_id: int, status: OrderStatus):
    _force(order_id, status=status.value, payment_session_id="cs_race")
    snapshot = orders.read(order_id)
    db.session.rollback()
    return snapshot


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_a_transition_saved_from_a_stale_version_is_refused_as_a_lost_race_and_writes_nothing(order_id, transition):
    before, move = TRANSITIONS[transition]
    snapshot = _snapshot_in(order_id, before)
    _force(order_id, version=Order.__table__.c.version + 1)  # another writer committed meanwhile
    moved, events = _row(order_id), _events(order_id)
    result = move(snapshot)
    assert result.ok
    with pytest.raises(orders.LostRace) as lost:
        orders.save(snapshot, transition, result.events, now=utcnow())
    db.session.rollback()
    assert isinstance(lost.value, StaleDataError)  # what the callers' retries already catch
    assert (lost.value.order_id, lost.value.transition) == (order_id, transition)
    assert _row(order_id) == moved and _events(order_id) == events


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_a_transition_saved_at_its_version_bumps_it_once_and_writes_its_events(order_id, transition):
    before, move = TRANSITIONS[transition]
    snapshot = _snapshot_in(order_id, before)
    seen, events = snapshot.version, _events(order_id)
    result = move(snapshot)
    orders.save(snapshot, transition, result.events, now=utcnow())
    db.session.commit()
    row = _row(order_id)
    assert (row.status, row.version, snapshot.version) == (snapshot.status, seen + 1, seen + 1)
    assert _events(order_id) == events + len(result.events)


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_a_transition_saved_from_a_state_it_does_not_leave_is_refused_the_same_way(order_id, transition):
    """The status guard holds on its own: a snapshot at the current version whose status the
    transition may leave from, while the row is (by a writer that skipped the version) in one it may not."""
    before, move = TRANSITIONS[transition]
    snapshot = _snapshot_in(order_id, before)
    allowed = ALLOWED.get(transition, {S.CANCELLED}) | (
        {S.PAYMENT_INITIATED} if transition == "adopt_and_pay" else set()
    )
    other = next(s for s in (S.PAID, S.CANCELLED, S.PENDING_PAYMENT) if s not in allowed)
    _force(order_id, status=other.value)
    result = move(snapshot)
    with pytest.raises(orders.LostRace):
        orders.save(snapshot, transition, result.events, now=utcnow())
    db.session.rollback()
    assert _row(order_id).status == other.value


@pytest.mark.parametrize("what,at", [("processing", True), ("stop_watching", False), ("next_check", True)])
def test_a_bookkeeping_note_neither_bumps_the_version_nor_moves_the_orders_age(order_id, what, at):
    before = _row(order_id)
    snapshot = orders.read(order_id)
    db.session.rollback()
    later = utcnow() + timedelta(hours=1)
    orders.note(order_id, what, later if at else None)
    db.session.commit()
    after = _row(order_id)
    assert (after.version, as_utc(after.updated_at)) == (before.version, as_utc(before.updated_at))
    if what == "processing":
        assert as_utc(after.payment_processing_at) == later
    elif what == "next_check":
        assert as_utc(after.provider_next_check_at) == later
    else:
        assert after.payment_processing_at is None and after.provider_next_check_at is None
    # So a transition decided on the snapshot read before the note still saves.
    result = snapshot.cancel(CANCELLED_BY_CUSTOMER)
    orders.save(snapshot, "cancel", result.events)
    db.session.commit()
    assert _row(order_id).status == S.CANCELLED.value


def test_every_prebuilt_statement_of_the_store_is_in_its_registry():
    """The statement-cache test iterates STATEMENTS: a statement left out of it is not checked."""
    from sqlalchemy.sql.base import Executable

    registered = {id(s) for s in orders.STATEMENTS.values()}
    loose = [
        name for name, value in vars(orders).items() if isinstance(value, Executable) and id(value) not in registered
    ]
    assert loose == []


# -- nothing else writes `orders` --------------------------------------------------------------

STORE = ROOT / "shop" / "store" / "orders.py"
# What an order's state looks like on a mapped Order; assigning any of them outside the store
# and the domain (whose transitions run on the store's snapshots) is a write that skips the store.
ORDER_COLUMNS = {c.name for c in Order.__table__.columns}


def _writes_outside_the_store(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    found = []
    for node in ast.walk(tree):
        # update(Order ...) / insert(Order ...) / delete(Order ...), or on Order.__table__
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("update", "insert", "delete")
            and node.args
        ):
            target = ast.unparse(node.args[0])
            if target in ("Order", "Order.__table__", "OrderLine", "OrderLine.__table__", "_orders", "_lines"):
                found.append(f"{where}:{node.lineno}: {node.func.id}({target})")
        # any use of the orders table object itself: the store hands out statements, not the table
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "__table__"
            and ast.unparse(node.value) in ("Order", "OrderLine")
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        # order.status = ..., order.payment_processing_at = ... on an order (a name ending in `order`)
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (
                        isinstance(t, ast.Attribute)
                        and t.attr in ORDER_COLUMNS
                        and isinstance(t.value, ast.Name)
                        and t.value.id.endswith("order")
                        and t.attr != "id"
                    ):
                        found.append(f"{where}:{node.lineno}: {ast.unparse(t)} = ...")
    return found


def test_no_module_but_the_order_store_writes_the_orders_table():
    # The mapped class itself; the domain's transitions assign the state on whatever carries it
    # (the store's snapshot, which the store then saves).
    allowed = {STORE, ROOT / "shop" / "models" / "orders.py", ROOT / "shop" / "domain" / "order.py"}
    found = []
    for path in sorted((ROOT / "shop").rglob("*.py")):
        if path in allowed or "migrations" in path.parts:
            continue
        found.extend(_writes_outside_the_store(path))
    assert found == [], "writes of `orders` outside shop/store/orders.py:\n" + "\n".join(found)


def test_the_walk_finds_the_writes_it_looks_for(tmp_path):
    """The check above would pass on an empty walk: pin that each shape is caught."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "db.session.execute(update(Order).values(status='Paid'))\n"
        "t = Order.__table__\n"
        "order.payment_processing_at = None\n"
        "order.status, order.version = 'Paid', 2\n"
    )
    assert len(_writes_outside_the_store(sample)) == 5
