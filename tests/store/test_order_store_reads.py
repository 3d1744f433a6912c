"""The order store's reads and its bookkeeping beside the transitions (shop/store/order_store.py):
what each read hands out, what text from outside finds (and what never reaches the database), and
the notes that answer whether they wrote (a decline, a line's restocked units, an address)."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select

from factories import force_order, place_order_for, seed_catalog_rows
from shop import logs
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.order import OrderStatus, Transition
from shop.extensions import db
from shop.models import Order, OrderLine
from shop.store import order_store

S = OrderStatus


def _another_order(browser: str | None = None, now=None) -> int:
    placed = place_order_for({next(iter(sorted(seed_catalog_rows().values()))): 1}, browser=browser, now=now)
    db.session.remove()
    return placed.order_id


def _reference(order_id: int) -> str:
    reference = db.session.execute(select(Order.reference).where(Order.id == order_id)).scalar_one()
    db.session.rollback()
    return reference


def test_the_payment_read_hands_out_the_order_at_its_version_as_the_full_read_sees_it(order_id):
    force_order(order_id, status=S.PAYMENT_INITIATED.value, payment_session_id="cs_read", version=4)
    full, quick = order_store.read(order_id), order_store.read_for_payment(order_id)
    db.session.rollback()
    fields = ("id", "reference", "status", "version", "total", "currency", "payment_session_id", "inventory_restored")
    assert [getattr(quick, f) for f in fields] == [getattr(full, f) for f in fields]
    assert (quick.status, quick.version, quick.payment_session_id) == (S.PAYMENT_INITIATED, 4, "cs_read")
    assert quick.total > 0 and quick.currency == "usd"
    assert order_store.read_for_payment(order_id + 1000) is None


def test_a_read_hands_out_every_column_a_decision_may_use_as_the_row_holds_it(order_id):
    at = utcnow() - timedelta(minutes=30)
    held = dict(
        payment_session_id="cs_all",
        payment_session_url="https://pay.example/cs_all",
        payment_session_expires_at=at + timedelta(hours=1),
        payment_attempts=2,
        inventory_restored=True,
        payment_processing_at=at,
        late_money_watch_since=at - timedelta(minutes=1),
        last_payment_error="Declined.",
        updated_at=at - timedelta(minutes=2),
        ships=True,
        shipping_details={"name": "Ann"},
        tax=40,
        charged=1040,
    )
    force_order(order_id, **held)
    order = order_store.read(order_id)
    row = db.session.get(Order, order_id)
    fixed = ("id", "reference", "status", "version", "total", "currency", "email", "access_token")
    assert [getattr(order, f) for f in fixed] == [getattr(row, f) for f in fixed]
    assert order.reference.startswith("BK-") and "@" in order.email and order.access_token and order.total > 0
    when = {"payment_session_expires_at", "payment_processing_at", "late_money_watch_since", "updated_at"}
    assert {f: as_utc(getattr(order, f)) if f in when else getattr(order, f) for f in held} == held
    db.session.rollback()


def test_a_read_loads_the_lines_only_when_asked(order_id):
    bare, with_lines = order_store.read(order_id), order_store.read(order_id, lines=True)
    assert bare.lines == ()
    [line] = with_lines.lines
    assert line.quantity == 1 and line.unit_price * line.quantity == with_lines.total
    db.session.rollback()


@contextmanager
def _statements():
    """The SQL statements run inside the block (a list, filled as they run)."""
    statements = []

    def record(conn, cursor, statement, *args):
        statements.append(statement)

    sa_event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        sa_event.remove(db.engine, "before_cursor_execute", record)


def test_a_read_of_a_row_this_transaction_holds_asks_the_database_nothing_unless_asked_to_read_afresh(order_id):
    held = db.session.get(Order, order_id)  # a row this transaction has loaded (and still holds)
    with _statements() as statements:
        assert order_store.read(order_id).version == held.version
        assert statements == []
        assert order_store.read(order_id, fresh=True).version == held.version
        assert len(statements) == 1
    db.session.rollback()


@pytest.mark.parametrize("bad_id", [0, -1, 2**31, 2**40, "1", None])
def test_an_id_the_column_cannot_hold_finds_no_order_instead_of_failing(order_id, bad_id):
    assert order_store.read(bad_id) is None and not order_store.usable_id(bad_id)
    assert order_store.usable_id(2**31 - 1) and order_store.usable_id(1)


def test_an_id_given_as_text_finds_no_order_even_where_the_database_would_match_it(order_id):
    # SQLite compares the integer key with the text '7' as 7: the store refuses it before asking.
    assert order_store.read(str(order_id)) is None and order_store.read(order_id).id == order_id
    db.session.rollback()


def test_an_order_read_for_a_decision_names_the_lines_logged_after_it(order_id):
    reference = _reference(order_id)
    with logs.scope(request_id="req-store"):
        order_store.read(order_id)
        assert logs.current() == {"request_id": "req-store", "order_ref": reference, "order_id": order_id}
    with logs.scope():
        order_store.read_for_payment(order_id)
        assert logs.current() == {"order_ref": reference, "order_id": order_id}
    with logs.scope():
        order_store.read_by_reference(reference)
        assert logs.current() == {"order_ref": reference, "order_id": order_id}
    db.session.rollback()


def test_an_order_is_found_by_its_reference(order_id):
    reference = _reference(order_id)
    assert order_store.by_reference(reference).id == order_id
    loaded = order_store.read_by_reference(reference)
    assert (loaded.id, loaded.reference, loaded.status) == (order_id, reference, S.PENDING_PAYMENT)
    assert loaded.lines == ()  # a payment notice's read: the lines are not its business (nor a query)
    assert order_store.by_reference(reference + "X") is None and order_store.read_by_reference(reference + "X") is None
    db.session.rollback()


@pytest.mark.parametrize("text", [None, "", "BK-NUL\x00", "BK 1234", "BK-%", "B" * 21])
def test_text_that_cannot_be_a_reference_finds_nothing_without_asking_the_database(order_id, text):
    force_order(order_id, reference="B" * 20)
    assert order_store.by_reference(text) is None and order_store.read_by_reference(text) is None
    assert order_store.by_reference("B" * 20).id == order_id  # the longest a reference may be is still looked up
    db.session.rollback()


def test_a_browsers_orders_are_its_own_newest_first_with_their_lines_and_refunds_loaded(fresh_ctx):
    start = utcnow() - timedelta(hours=3)
    later = _another_order("browser-mine", now=start + timedelta(hours=1))  # placed first, yet newer
    same_time = [_another_order("browser-mine", now=start) for _ in range(2)]  # (a browser holds 3 unpaid at most)
    _another_order("browser-other", now=start + timedelta(hours=2))
    orders = order_store.of_browser("browser-mine")
    assert [o.id for o in orders] == [later, max(same_time), min(same_time)]  # a tie: the last placed first
    with _statements() as statements:  # loaded with the orders, one query each, not one per order
        assert all(len(o.lines) == 1 and o.refunds == [] for o in orders)
    assert statements == []
    assert order_store.of_browser("browser-nobody") == []
    db.session.rollback()


def test_a_browsers_order_summaries_are_one_statement_of_their_columns_newest_first(fresh_ctx):
    """The list's JSON gives each order's reference, status, total, currency and time only: its read
    is one statement of those columns (neither the lines' query nor the refunds', no order built)."""
    seed_catalog_rows()
    start = utcnow() - timedelta(hours=3)
    older = _another_order("browser-list", now=start)
    newer = _another_order("browser-list", now=start + timedelta(hours=1))
    _another_order("browser-other", now=start + timedelta(hours=2))
    with _statements() as statements:
        rows = order_store.summaries_of_browser("browser-list")
    references = {o.id: o.reference for o in db.session.execute(select(Order)).scalars()}
    assert [row.reference for row in rows] == [references[newer], references[older]]
    assert rows[0]._fields == ("reference", "status", "total", "currency", "created_at")
    assert rows[0].status is OrderStatus.PENDING_PAYMENT
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]  # (SQLite's BEGIN aside)
    assert len(reads) == 1 and "FROM orders" in reads[0] and "access_token" not in reads[0]
    db.session.rollback()


def test_an_order_read_by_reference_with_details_comes_with_its_lines_and_refunds_in_one_statement(fresh_ctx):
    """An order's page shows its lines and refunds: read with the order, not one query each after."""
    seed_catalog_rows()
    reference = _reference(_another_order("browser-page"))
    with _statements() as statements:
        page = order_store.by_reference(reference, details=True)
        assert page is not None and len(page.lines) == 1 and page.refunds == []
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]  # (SQLite's BEGIN aside)
    assert len(reads) == 1 and "order_lines" in reads[0] and "refunds" in reads[0]
    db.session.rollback()


def test_the_current_state_is_what_is_committed_now_not_what_was_read(order_id):
    read = order_store.read(order_id)
    force_order(order_id, status=S.PAYMENT_INITIATED.value, payment_session_id="cs_now")
    assert tuple(order_store.current_state(order_id)) == (S.PAYMENT_INITIATED, "cs_now")
    assert read.status is S.PENDING_PAYMENT
    assert order_store.current_state(order_id + 1000) is None
    db.session.rollback()


# -- bookkeeping that answers ----------------------------------------------------------------------


def _declines(order_id: int):
    db.session.expire_all()
    row = db.session.execute(
        select(Order.payment_declined_at, Order.last_payment_error, Order.version, Order.updated_at).where(
            Order.id == order_id
        )
    ).one()
    db.session.rollback()
    return row


def test_a_decline_is_noted_on_an_order_waiting_at_that_attempts_page_only(order_id):
    force_order(order_id, status=S.PAYMENT_INITIATED.value, payment_attempts=2)
    before, at = _declines(order_id), utcnow() - timedelta(minutes=1)
    assert not order_store.note_declined(order_id, 1, "an older page", at)  # a newer attempt replaced it
    db.session.commit()
    assert _declines(order_id).last_payment_error is None
    assert order_store.note_declined(order_id, 2, "Your card was declined.", at)
    db.session.commit()
    after = _declines(order_id)
    assert (as_utc(after.payment_declined_at), after.last_payment_error) == (at, "Your card was declined.")
    assert (after.version, after.updated_at) == (before.version, before.updated_at)
    force_order(order_id, status=S.PAID.value)
    assert not order_store.note_declined(order_id, 2, "too late", at + timedelta(seconds=1))
    db.session.commit()
    assert _declines(order_id).last_payment_error == "Your card was declined."


def test_a_note_of_a_queue_place_keeps_an_earlier_one_and_leaves_a_paid_order_alone(order_id):
    Note, first = order_store.Note, utcnow() - timedelta(minutes=9)
    order_store.note(order_id, Note.QUEUE, first)
    order_store.note(order_id, Note.QUEUE, first + timedelta(minutes=5))
    db.session.commit()
    assert as_utc(db.session.get(Order, order_id).payment_queued_at) == first
    order_store.note(order_id, Note.LEAVE_QUEUE)
    db.session.commit()
    assert db.session.get(Order, order_id).payment_queued_at is None
    force_order(order_id, status=S.PAID.value)
    order_store.note(order_id, Note.QUEUE, first)
    db.session.commit()
    assert db.session.get(Order, order_id).payment_queued_at is None
    db.session.rollback()


def test_a_note_or_a_noted_decline_leaves_no_stale_mapped_order_in_the_session(order_id):
    mapped, at = db.session.get(Order, order_id), utcnow() - timedelta(minutes=3)
    assert mapped.payment_processing_at is None
    order_store.note(order_id, order_store.Note.PROCESSING, at)
    assert as_utc(mapped.payment_processing_at) == at  # same transaction, no expire by the caller
    db.session.rollback()
    force_order(order_id, status=S.PAYMENT_INITIATED.value, payment_attempts=1)
    mapped = db.session.get(Order, order_id)
    assert mapped.last_payment_error is None
    assert order_store.note_declined(order_id, 1, "Declined.", at)
    assert mapped.last_payment_error == "Declined."
    db.session.rollback()


def test_an_operators_new_address_replaces_the_old_one_without_a_version_bump(order_id):
    row = db.session.get(Order, order_id)
    old, version = row.email, row.version
    assert order_store.change_email(order_id, "new.address@example.com") == old
    assert row.email == "new.address@example.com"  # the session's mapped order is not left stale
    db.session.commit()
    db.session.expire_all()
    assert (db.session.get(Order, order_id).email, db.session.get(Order, order_id).version) == (
        "new.address@example.com",
        version,
    )
    assert order_store.change_email(order_id + 1000, "nobody@example.com") is None
    db.session.rollback()


def test_a_lines_restocked_units_are_counted_up_to_what_it_bought_and_no_further(fresh_ctx):
    sku = next(iter(sorted(seed_catalog_rows().values())))
    order_id = place_order_for({sku: 3}).order_id
    other = _another_order()
    line = db.session.execute(select(OrderLine.id).where(OrderLine.order_id == order_id)).scalar_one()

    def restocked() -> int:
        db.session.expire_all()
        return db.session.execute(select(OrderLine.restocked).where(OrderLine.id == line)).scalar_one()

    assert not order_store.count_restocked(other, line, 1)  # the line is not that order's
    assert order_store.count_restocked(order_id, line, 2)
    assert not order_store.count_restocked(order_id, line, 2)  # 4 would pass the 3 bought
    assert order_store.count_restocked(order_id, line, 1)  # exactly what was bought
    assert not order_store.count_restocked(order_id, line, 1)
    db.session.commit()
    assert restocked() == 3
    db.session.rollback()


# -- what a payment saves with the transition -----------------------------------------------------


def test_a_started_payment_saves_its_attempt_and_a_paid_one_what_it_charged_and_where_it_ships(order_id):
    expires = utcnow() + timedelta(hours=1)
    order = order_store.read(order_id)
    result = order.start_payment("cs_saved", "https://pay.example/cs_saved")
    order.attempt(3, expires)
    order_store.save(order, Transition.START_PAYMENT, result.events)
    db.session.commit()
    result = order.mark_paid("cs_saved", 1260, "usd")
    order.ships_to({"name": "Ann", "city": "Lyon"})
    order.ships_to(None)  # a payment that collected no address keeps the one it has
    order.charged_with(1260, 60)
    order_store.save(order, Transition.MARK_PAID, result.events)
    db.session.commit()
    db.session.expire_all()
    row = db.session.get(Order, order_id)
    assert (row.payment_attempts, as_utc(row.payment_session_expires_at)) == (3, expires)
    assert (row.payment_session_url, row.status) == ("https://pay.example/cs_saved", S.PAID)
    assert (row.shipping_details, row.charged, row.tax) == ({"name": "Ann", "city": "Lyon"}, 1260, 60)
    db.session.rollback()


def test_a_failed_payment_saves_the_words_the_order_page_shows(order_id):
    force_order(order_id, status=S.PAYMENT_INITIATED.value, payment_session_id="cs_failed")
    order = order_store.read(order_id)
    result = order.mark_payment_failed("card_declined")
    order.failed_because("The card was declined.")
    order_store.save(order, Transition.MARK_PAYMENT_FAILED, result.events)
    db.session.commit()
    db.session.expire_all()
    assert db.session.get(Order, order_id).last_payment_error == "The card was declined."
    db.session.rollback()


def test_an_order_just_placed_is_handed_out_as_committed_without_reading_it_back(fresh_ctx):
    from shop.store.loaded_order import LoadedOrder

    sku = next(iter(sorted(seed_catalog_rows().values())))
    placed = place_order_for({sku: 2})
    order = LoadedOrder.just_placed(placed)
    read = order_store.read(placed.order_id, lines=True)
    same = ("id", "reference", "status", "version", "total", "currency", "email", "access_token", "lines", "ships")
    assert [getattr(order, f) for f in same] == [getattr(read, f) for f in same]
    assert (order.status, order.version, order.payment_attempts) == (S.PENDING_PAYMENT, 1, 0)
    assert order.updated_at == placed.placed_at and order.lines[0].quantity == 2
    db.session.rollback()


# -- new orders ------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_line,ships", [(False, False), (True, True)])
def test_a_new_order_is_pending_at_version_one_stamped_with_its_time_and_holds_its_lines(fresh_ctx, in_line, ships):
    placed_at = utcnow() - timedelta(hours=5)
    line = dict(variant_id=7, sku="MUG-1", name="Mug", quantity=2, unit_price=450)
    flags = dict(in_line=True, ships=True) if in_line else {}  # the defaults: not in line, nothing to ship
    with logs.scope():
        order_id = order_store.insert_order(
            db.session,
            reference="BK-NEW00001",
            access_token="token-new",
            browser_id="browser-new",
            email="new@example.com",
            total=900,
            currency="usd",
            now=placed_at,
            lines=[line],
            **flags,
        )
        assert logs.current() == {"order_ref": "BK-NEW00001", "order_id": order_id}
    db.session.commit()
    row = db.session.get(Order, order_id)
    assert (row.status, row.version, row.payment_attempts, row.inventory_restored) == (S.PENDING_PAYMENT, 1, 0, False)
    assert as_utc(row.created_at) == as_utc(row.updated_at) == placed_at
    assert (row.payment_queued_at and as_utc(row.payment_queued_at), row.ships) == (
        placed_at if in_line else None,
        ships,
    )
    assert [(x.order_id, x.sku, x.quantity, x.unit_price) for x in row.lines] == [(order_id, "MUG-1", 2, 450)]
    db.session.rollback()
