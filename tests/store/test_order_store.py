"""The order store's contract (shop/store/order_store.py): every transition is saved by one
version-guarded UPDATE and refused the same way when the order moved meanwhile (`LostRace`,
nothing written, not even its events); bookkeeping notes never bump the version nor move the
order's age; and no module but the store writes the `orders` table."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm.exc import StaleDataError

from factories import force_order
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.order import ALLOWED, CANCELLED_BY_CUSTOMER, OrderStatus, Transition
from shop.extensions import db
from shop.models import Order, OutboxEvent
from shop.models.orders import ReadOnlyOrder
from shop.store import order_statements, order_store
from support import REPO_ROOT

S = OrderStatus
ROOT = REPO_ROOT


def _row(order_id: int):
    db.session.expire_all()
    row = db.session.execute(
        select(
            Order.status,
            Order.version,
            Order.updated_at,
            Order.inventory_restored,
            Order.payment_processing_at,
            Order.late_money_watch_since,
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
    "adopt_and_authorize": (
        S.PENDING_PAYMENT,
        lambda o: (o.start_payment("cs_race"), o.mark_authorized("cs_race", 1, "usd"))[1],
    ),
    "mark_payment_failed": (S.PAYMENT_INITIATED, lambda o: o.mark_payment_failed("declined")),
    "cancel": (S.PAYMENT_INITIATED, lambda o: o.cancel(CANCELLED_BY_CUSTOMER)),
    "mark_inventory_restored": (S.CANCELLED, lambda o: o.mark_inventory_restored()),
    "restock_paid": (S.PAID, lambda o: o.restock_paid()),
    "mark_authorized": (S.PAYMENT_INITIATED, lambda o: o.mark_authorized("cs_race", 1, "usd")),
    "ship": (S.PAID, lambda o: o.ship("1Z999", utcnow())),
}


def test_every_transition_the_store_saves_is_pinned_here():
    assert set(TRANSITIONS) == set(order_store.TRANSITIONS)


def _snapshot_in(order_id: int, status: OrderStatus):
    force_order(order_id, status=status.value, payment_session_id="cs_race")
    snapshot = order_store.read(order_id)
    db.session.rollback()
    return snapshot


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_a_transition_saved_from_a_stale_version_is_refused_as_a_lost_race_and_writes_nothing(order_id, transition):
    before, move = TRANSITIONS[transition]
    snapshot = _snapshot_in(order_id, before)
    force_order(order_id, version=Order.__table__.c.version + 1)  # another writer committed meanwhile
    moved, events = _row(order_id), _events(order_id)
    result = move(snapshot)
    assert result.ok
    with pytest.raises(order_store.LostRace) as lost:
        order_store.save(snapshot, transition, result.events, now=utcnow())
    db.session.rollback()
    assert isinstance(lost.value, StaleDataError)  # what the callers' retries already catch
    assert (lost.value.order_id, lost.value.transition) == (order_id, transition)
    words = str(lost.value)  # what the log says of the lost race
    assert f"order {snapshot.reference} changed" in words and f"({transition} from version {snapshot.version})" in words
    assert _row(order_id) == moved and _events(order_id) == events


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_a_transition_saved_at_its_version_bumps_it_once_and_writes_its_events(order_id, transition):
    before, move = TRANSITIONS[transition]
    snapshot = _snapshot_in(order_id, before)
    seen, events = snapshot.version, _events(order_id)
    result = move(snapshot)
    order_store.save(snapshot, transition, result.events, now=utcnow())
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
        {S.PAYMENT_INITIATED} if transition in ("adopt_and_pay", "adopt_and_authorize") else set()
    )
    other = next(s for s in (S.PAID, S.CANCELLED, S.PENDING_PAYMENT) if s not in allowed)
    force_order(order_id, status=other.value)
    result = move(snapshot)
    with pytest.raises(order_store.LostRace):
        order_store.save(snapshot, transition, result.events, now=utcnow())
    db.session.rollback()
    assert _row(order_id).status == other.value


@pytest.mark.parametrize("what", list(order_store.Note))
def test_a_bookkeeping_note_neither_bumps_the_version_nor_moves_the_orders_age(order_id, what):
    N = order_store.Note
    before = _row(order_id)
    loaded = order_store.read(order_id)
    db.session.rollback()
    later = utcnow() + timedelta(hours=1)
    order_store.note(order_id, what, later)
    db.session.commit()
    after = _row(order_id)
    assert (after.version, as_utc(after.updated_at)) == (before.version, as_utc(before.updated_at))
    written = {
        N.PROCESSING: ("payment_processing_at", later),
        N.WATCH: ("late_money_watch_since", later),
        N.NEXT_CHECK: ("provider_next_check_at", later),
        N.STOP_WATCHING: ("late_money_watch_since", None),
    }
    if what in written:
        column, value = written[what]
        assert (as_utc(getattr(after, column)) if value else getattr(after, column)) == value
    # So a transition decided on the order read before the note still saves.
    if loaded.can(Transition.CANCEL):
        result = loaded.cancel(CANCELLED_BY_CUSTOMER)
        order_store.save(loaded, Transition.CANCEL, result.events)
        db.session.commit()
        assert _row(order_id).status == S.CANCELLED.value


def test_a_cancel_turns_a_settling_payment_into_the_late_money_watch_from_when_it_began(order_id):
    """The two facts apart: an async payment settling on a live order, and the sweep's watch of a
    cancelled one whose session could still take money; the cancel moves the first to the second."""
    settling_since = utcnow() - timedelta(minutes=5)
    order_store.note(order_id, order_store.Note.PROCESSING, settling_since)
    db.session.commit()
    loaded = order_store.read(order_id)
    order_store.save(loaded, Transition.CANCEL, loaded.cancel(CANCELLED_BY_CUSTOMER).events, watch_from=utcnow())
    db.session.commit()
    row = _row(order_id)
    assert row.payment_processing_at is None
    assert as_utc(row.late_money_watch_since) == settling_since


def test_every_prebuilt_statement_of_the_store_is_in_its_registry():
    """The statement-cache test iterates STATEMENTS: a statement left out of it is not checked."""
    from sqlalchemy.sql.base import Executable

    registered = {id(s) for s in order_statements.STATEMENTS.values()}
    loose = [
        name
        for module in (order_statements, order_store)
        for name, value in vars(module).items()
        if isinstance(value, Executable) and id(value) not in registered
    ]
    assert loose == []


# -- nothing else writes `orders` --------------------------------------------------------------

STORE = ROOT / "shop" / "store" / "order_store.py"
# What an order's state looks like on a mapped Order; assigning any of them outside the store
# and the domain (whose transitions run on the store's orders) is a write that skips the store.
ORDER_COLUMNS = {c.name for c in Order.__table__.columns}
# The domain's transitions: called on a mapped order they would change the row behind the store.
TRANSITION_METHODS = {t.value for t in Transition} | {"can"}
# Where a mapped order comes from: a name bound to one of these is a row, not the store's order.
MAPPED_LOADS = ("get(Order", "select(Order)", "query(Order", "by_reference(")
# The one writer, the mapped class and the rules it no longer carries, and the tests' one forced
# write (factories.force_order), which is how a test says "time, or another writer, did this".
ALLOWED_WRITERS = {
    STORE,
    STORE.with_name("order_statements.py"),  # the statements it runs, built once there
    ROOT / "shop" / "models" / "orders.py",
    ROOT / "shop" / "domain" / "order.py",
    ROOT / "tests" / "factories.py",
    Path(__file__).resolve(),
}


def _mapped_names(tree) -> set[str]:
    """Names bound (anywhere in the module) to a mapped order: `row = db.session.get(Order, id)`."""
    names = set()
    for node in ast.walk(tree):
        source = ast.unparse(node.value) if isinstance(node, ast.Assign) else ""
        if any(load in source for load in MAPPED_LOADS) and "read_by_reference(" not in source:
            for target in node.targets:
                names.update(t.id for t in ast.walk(target) if isinstance(t, ast.Name))
    return names


def _writes_outside_the_store(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    rows = _mapped_names(tree)
    found = []

    def is_order(value) -> bool:
        return isinstance(value, ast.Name) and (value.id.endswith("order") or value.id in rows)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            # update(Order ...) / insert(Order ...) / delete(Order ...), or on Order.__table__
            if isinstance(func, ast.Name) and func.id in ("update", "insert", "delete") and node.args:
                target = ast.unparse(node.args[0])
                if target in ("Order", "Order.__table__", "OrderLine", "OrderLine.__table__", "_orders", "_lines"):
                    found.append(f"{where}:{node.lineno}: {func.id}({target})")
            # Order(...) / OrderLine(...): a new mapped row, inserted by the next flush
            if isinstance(func, ast.Name) and func.id in ("Order", "OrderLine"):
                found.append(f"{where}:{node.lineno}: {func.id}(...)")
            # row.cancel(...) on a mapped order, or session.add/merge/delete(row)
            if isinstance(func, ast.Attribute) and func.attr in TRANSITION_METHODS and is_order(func.value):
                if isinstance(func.value, ast.Name) and func.value.id in rows:
                    found.append(f"{where}:{node.lineno}: {ast.unparse(func)}(...)")
            if isinstance(func, ast.Attribute) and func.attr in ("add", "merge", "delete") and node.args:
                if isinstance(node.args[0], ast.Name) and node.args[0].id in rows:
                    found.append(f"{where}:{node.lineno}: {ast.unparse(func)}({node.args[0].id})")
        # any use of the orders table object itself: the store hands out statements, not the table
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "__table__"
            and ast.unparse(node.value) in ("Order", "OrderLine")
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        # order.status = ..., row.payment_processing_at = ... on an order
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (
                        isinstance(t, ast.Attribute)
                        and t.attr in ORDER_COLUMNS
                        and t.attr != "id"
                        and is_order(t.value)
                    ):
                        found.append(f"{where}:{node.lineno}: {ast.unparse(t)} = ...")
    return found


def test_no_module_or_test_but_the_order_store_writes_the_orders_table():
    found = []
    for folder in ("shop", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in ALLOWED_WRITERS or "migrations" in path.parts:
                continue
            found.extend(_writes_outside_the_store(path))
    assert found == [], "writes of `orders` outside shop/store/order_store.py:\n" + "\n".join(found)


def test_the_walk_finds_the_writes_it_looks_for(tmp_path):
    """The check above would pass on an empty walk: pin that each shape is caught."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "db.session.execute(update(Order).values(status='Paid'))\n"
        "t = Order.__table__\n"
        "order.payment_processing_at = None\n"
        "order.status, order.version = 'Paid', 2\n"
        "row = db.session.get(Order, 7)\n"
        "row.cancel('because')\n"
        "row.total = 1\n"
        "db.session.add(row)\n"
        "db.session.add(Order(reference='x'))\n"
    )
    lines = sorted(int(found.split(":")[1]) for found in _writes_outside_the_store(sample))
    assert lines == [1, 2, 3, 4, 4, 6, 7, 8, 9]  # each write once; line 5 only loads the row


def test_a_flush_refuses_to_write_a_mapped_order(order_id):
    """The mapped Order is data to read: a change made on it never reaches the table."""
    row = db.session.get(Order, order_id)
    row.status = S.PAID
    with pytest.raises(ReadOnlyOrder):
        db.session.commit()
    db.session.rollback()
    assert db.session.get(Order, order_id).status == S.PENDING_PAYMENT
    assert not hasattr(Order, "cancel") and not hasattr(Order, "mark_paid")
