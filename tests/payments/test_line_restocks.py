"""An operator's refund puts back a chosen number of each line's units (saga.line_restock,
docs/REFERENCE.md, *Refunding a paid order*): never more than was bought less what earlier refunds
put back, each refund's units once (a double submit, a concurrent refund or a restore run after
give none back again), and its answer names each unit with the stock before and after."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select

from factories import on_hand
from payment_helpers import place_and_pay
from shop.domain.deadlines import utcnow
from shop.domain.events import OrderCancelled
from shop.extensions import db
from shop.models import InventoryItem, Order, OrderLine, Refund, RefundRestock
from shop.outbox import uow
from shop.saga.inventory import RestoreOutcome, restore_inventory
from shop.saga.line_restock import lines_left
from shop.saga.operator_refunds import RefundOutcome, refund_order

OPERATOR = "night-shift@example.com"


@pytest.fixture
def two_pairs(monkeypatch, tmp_path, make_fresh_app, sandbox):
    """A paid order of one line of 2 x SOCK-M: (app, order id, the line's id, the sock's variant)."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    app, oid, _total, skus = place_and_pay(make_fresh_app, sandbox, "SOCK-M", 2)
    with app.app_context():
        line_id = db.session.execute(select(OrderLine.id).where(OrderLine.order_id == oid)).scalar_one()
        db.session.remove()
    return app, oid, line_id, skus["SOCK-M"]


def _refund(app, oid, key, restock, amount=100):
    with app.app_context():
        result = refund_order(
            oid, amount=amount, reason="one pair came back", restock=restock, request_key=key, operator=OPERATOR
        )
        db.session.remove()
        return result


def _counted(app, oid):
    """(the line's restocked count, the order's marker, [(refund id, units) recorded])."""
    with app.app_context():
        restocked = db.session.execute(select(OrderLine.restocked).where(OrderLine.order_id == oid)).scalar_one()
        marker = db.session.get(Order, oid).inventory_restored
        records = db.session.execute(select(RefundRestock.refund_id, RefundRestock.quantity)).all()
        db.session.remove()
        return restocked, marker, sorted(tuple(r) for r in records)


def test_a_partial_restock_puts_back_only_the_units_asked_and_names_them_with_the_stock(two_pairs):
    app, oid, line, sock = two_pairs
    before = on_hand(sock, app)
    done = _refund(app, oid, "key-one-pair-000001", {line: 1})
    assert (done.outcome, done.restocked) == (RefundOutcome.DONE, True)
    assert on_hand(sock, app) == before + 1
    assert done.restock_words == f"1 × SOCK-M (stock {before} → {before + 1})"
    assert _counted(app, oid) == (1, False, [(done.refund_id, 1)])


def test_a_double_submit_puts_the_units_back_once_and_names_them_again(two_pairs):
    app, oid, line, sock = two_pairs
    before = on_hand(sock, app)
    first = _refund(app, oid, "key-one-pair-000002", {line: 1})
    again = _refund(app, oid, "key-one-pair-000002", {line: 1})
    assert (first.outcome, again.outcome) == (RefundOutcome.DONE, RefundOutcome.ALREADY)
    assert [g.words() for g in again.given] == [f"1 × SOCK-M (stock {before} → {before + 1})"]
    assert on_hand(sock, app) == before + 1
    assert _counted(app, oid) == (1, False, [(first.refund_id, 1)])


def test_no_refund_puts_back_more_than_was_bought_less_what_went_back(two_pairs):
    app, oid, line, sock = two_pairs
    before = on_hand(sock, app)
    first = _refund(app, oid, "key-one-pair-000003", {line: 1})
    too_many = _refund(app, oid, "key-one-pair-000004", {line: 2})
    assert (too_many.outcome, too_many.why) == (RefundOutcome.REFUSED, "restock_refused")
    assert too_many.restock_words == "2 × SOCK-M is more than can go back: 2 bought, 1 back already"
    # Refused whole: no second refund was written and the stock did not move.
    assert on_hand(sock, app) == before + 1
    assert _counted(app, oid) == (1, False, [(first.refund_id, 1)])
    # The last pair goes back with a later refund, and then the order's marker is set.
    last = _refund(app, oid, "key-one-pair-000005", True)
    assert (last.outcome, last.restock_words) == (RefundOutcome.DONE, f"1 × SOCK-M (stock {before + 1} → {before + 2})")
    assert _counted(app, oid) == (2, True, [(first.refund_id, 1), (last.refund_id, 1)])
    nothing = _refund(app, oid, "key-one-pair-000006", True)
    assert (nothing.outcome, nothing.why) == (RefundOutcome.REFUSED, "already_restocked")
    assert on_hand(sock, app) == before + 2


def test_a_line_of_another_order_is_refused_and_nothing_is_refunded(two_pairs):
    app, oid, line, sock = two_pairs
    before = on_hand(sock, app)
    other = _refund(app, oid, "key-one-pair-000007", {line + 1000: 1})
    assert (other.outcome, other.why) == (RefundOutcome.REFUSED, "restock_refused")
    assert other.restock_words == f"line {line + 1000} is not a line of this order"
    assert on_hand(sock, app) == before and _counted(app, oid) == (0, False, [])


def test_a_restore_run_after_a_partial_restock_gives_nothing_back(two_pairs):
    app, oid, line, sock = two_pairs
    before = on_hand(sock, app)
    _refund(app, oid, "key-one-pair-000008", {line: 1})
    with app.app_context():
        with uow.transaction():
            assert restore_inventory(OrderCancelled(oid, "redelivered"), utcnow()) is RestoreOutcome.NOT_CANCELLED
        db.session.remove()
    assert on_hand(sock, app) == before + 1


@pytest.mark.postgres
def test_concurrent_refunds_and_a_restore_give_each_unit_back_once(two_pairs, is_postgres):
    if not is_postgres:
        pytest.skip("concurrency is PostgreSQL's")
    from support import run_threads

    app, oid, line, sock = two_pairs
    before = on_hand(sock, app)

    def submit(job):
        if job == "restore":
            with uow.transaction():
                return restore_inventory(OrderCancelled(oid, "redelivered"), utcnow())
        return refund_order(
            oid, amount=100, reason="at once", restock={line: 2}, request_key=job, operator=OPERATOR
        ).outcome

    jobs = ["key-race-line-000001", "key-race-line-000001", "key-race-line-000002", "restore"]
    results, errors = run_threads(app, jobs, submit)
    assert errors == [None] * 4
    # One refund put the pair back; the other key was refused, and its twin was refused or ALREADY.
    assert results[:3].count(RefundOutcome.DONE) == 1
    assert set(results[:3]) - {RefundOutcome.DONE} <= {RefundOutcome.ALREADY, RefundOutcome.REFUSED}
    assert results[3] is RestoreOutcome.NOT_CANCELLED
    assert on_hand(sock, app) == before + 2
    restocked, marker, records = _counted(app, oid)
    assert (restocked, marker, [units for _, units in records]) == (2, True, [2])


def test_a_restock_of_no_units_is_a_refund_without_a_restock(two_pairs):
    # The form sends every line, most with 0: those ask for nothing, and the refund is not a restocking one.
    app, oid, line, sock = two_pairs
    before = on_hand(sock, app)
    done = _refund(app, oid, "key-no-units-000001", {line: 0})
    assert (done.outcome, done.restocked, done.given) == (RefundOutcome.DONE, False, ())
    with app.app_context():
        assert db.session.get(Refund, done.refund_id).restock is False
        db.session.remove()
    assert on_hand(sock, app) == before
    assert _counted(app, oid) == (0, False, [])


def test_a_line_put_back_in_full_leaves_the_order_unmarked_while_another_line_has_units_left(
    monkeypatch, tmp_path, make_fresh_app, sandbox
):
    # Two lines: 2 x SOCK-M and 1 x MUG-350-SND. Putting the socks back leaves the mug's unit to
    # come: the order's marker (every unit back) waits for it, and is set by the refund that takes it.
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    app, oid, _total, skus = place_and_pay(make_fresh_app, sandbox, "SOCK-M", 2, also={"MUG-350-SND": 1})
    with app.app_context():
        lines = dict(db.session.execute(select(OrderLine.sku, OrderLine.id).where(OrderLine.order_id == oid)).all())
        db.session.remove()
    before = on_hand(skus["SOCK-M"], app)
    # The mug's line asked for 0 units, and it comes first (its variant is the lower): it is passed
    # over, the socks still go back, and the answer names only what went back.
    socks = _refund(app, oid, "key-two-lines-00001", {lines["MUG-350-SND"]: 0, lines["SOCK-M"]: 2})
    assert (socks.outcome, socks.restocked) == (RefundOutcome.DONE, True)
    assert socks.restock_words == f"2 × SOCK-M (stock {before} → {before + 2})"
    with app.app_context():
        assert db.session.get(Order, oid).inventory_restored is False  # the mug's unit is still out
        db.session.remove()
    mug = _refund(app, oid, "key-two-lines-00002", {lines["MUG-350-SND"]: 1})
    assert (mug.outcome, mug.restocked) == (RefundOutcome.DONE, True)
    with app.app_context():
        assert db.session.get(Order, oid).inventory_restored is True
        db.session.remove()


def test_a_restock_of_a_variant_without_a_stock_row_is_refused_in_words_and_nothing_is_refunded(two_pairs):
    app, oid, line, sock = two_pairs
    with app.app_context():
        db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id == sock))
        db.session.commit()
    refused = _refund(app, oid, "key-no-stock-row-01", {line: 1})
    assert (refused.outcome, refused.why) == (RefundOutcome.REFUSED, "restock_refused")
    assert refused.restock_words == "SOCK-M has no stock row, or its stock would go over the maximum a row holds"
    assert _counted(app, oid) == (0, False, [])
    with app.app_context():
        assert db.session.execute(select(Refund.id)).first() is None  # the refund rolled back with it
        db.session.remove()


def test_a_restock_of_two_lines_names_both_and_the_form_lists_each_line_by_name(
    monkeypatch, tmp_path, make_fresh_app, sandbox
):
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    app, oid, _total, skus = place_and_pay(make_fresh_app, sandbox, "SOCK-M", 2, also={"MUG-350-SND": 1})
    with app.app_context():
        bought = db.session.execute(
            select(OrderLine.id, OrderLine.sku, OrderLine.name).where(OrderLine.order_id == oid).order_by(OrderLine.id)
        ).all()
        assert [(ln.id, ln.sku, ln.name, ln.quantity, ln.restocked) for ln in lines_left(oid)] == [
            (line_id, sku, name, 2 if sku == "SOCK-M" else 1, 0) for line_id, sku, name in bought
        ]
        db.session.remove()
    mug, sock = on_hand(skus["MUG-350-SND"], app), on_hand(skus["SOCK-M"], app)

    both = _refund(app, oid, "key-both-lines-0001", True)

    assert both.restock_words == f"1 × MUG-350-SND (stock {mug} → {mug + 1}); 2 × SOCK-M (stock {sock} → {sock + 2})"
    assert [(g.sku, g.quantity) for g in both.given] == [("MUG-350-SND", 1), ("SOCK-M", 2)]


def test_a_restock_of_chosen_units_once_all_are_back_is_refused_as_already_restocked(two_pairs):
    app, oid, line, _sock = two_pairs
    assert _refund(app, oid, "key-all-back-000001", True).restocked is True
    again = _refund(app, oid, "key-all-back-000002", {line: 1})
    assert (again.outcome, again.why, again.amount) == (RefundOutcome.REFUSED, "already_restocked", 100)
