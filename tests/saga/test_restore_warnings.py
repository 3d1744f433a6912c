"""An operator's answers to a restore warning (saga.warnings, docs/REFERENCE.md, Console): "fixed by
hand" closes it with their note; a retry runs the compensation again and closes it only when the
stock came back, and otherwise leaves it open once (the retry's own copy of the same problem folded
into it), saying why in the resolution. The console's route around them: tests/web/test_console.py."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import delete, update

from compensation_support import order, placed_and_cancelled, warnings
from factories import on_hand, seed_catalog_rows
from shop.domain.deadlines import utcnow
from shop.domain.restoration import MAX_ON_HAND
from shop.extensions import db
from shop.models import InventoryItem, RestoreWarning
from shop.outbox.dispatch import run_delivery
from shop.saga.inventory import RestoreOutcome, restore_inventory_now
from shop.saga.warnings import resolve_fixed_by_hand, retry_restore

STAMP = "night-shift@example.com at 03:00"


@pytest.fixture
def catalog(fresh_ctx):
    return seed_catalog_rows()


def _stock(variant_id: int, units: int) -> None:
    db.session.execute(update(InventoryItem).where(InventoryItem.variant_id == variant_id).values(on_hand=units))
    db.session.commit()


def _refused(catalog) -> tuple[int, int, int]:
    """A cancelled order whose restore an invariant refused: (order, its warning, the variant too full)."""
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    _stock(a5, MAX_ON_HAND - 1)
    assert run_delivery(delivery_id) == "done"
    [warning] = warnings(order_id)
    return order_id, warning.id, a5


def _warning(warning_id: int) -> RestoreWarning:
    db.session.expire_all()
    found = db.session.get(RestoreWarning, warning_id)
    assert found is not None
    return found


def test_fixed_by_hand_closes_the_warning_with_the_operators_note_and_time_once(catalog):
    _, warning_id, a5 = _refused(catalog)
    now = utcnow() + timedelta(minutes=5)

    assert resolve_fixed_by_hand(warning_id, STAMP, "recounted shelf B", now) is True
    closed = _warning(warning_id)
    assert (closed.state, closed.resolution) == ("resolved", f"fixed by hand ({STAMP}): recounted shelf B")
    assert closed.resolved_at == now
    assert on_hand(a5) == MAX_ON_HAND - 1  # no stock touched
    # Settled already: a second answer changes nothing.
    assert resolve_fixed_by_hand(warning_id, "someone else", "", now + timedelta(minutes=1)) is False
    assert (_warning(warning_id).resolution, _warning(warning_id).resolved_at) == (closed.resolution, now)


def test_fixed_by_hand_without_a_note_says_only_who_and_a_long_note_is_cut_to_the_column(catalog):
    _, first, _ = _refused(catalog)
    _, second, _ = _refused(catalog)
    assert resolve_fixed_by_hand(first, STAMP, "", utcnow())
    assert _warning(first).resolution == f"fixed by hand ({STAMP})"
    assert resolve_fixed_by_hand(second, STAMP, "n" * 5000, utcnow())
    assert len(_warning(second).resolution) == 4000


def test_a_retry_refused_again_keeps_the_warning_open_once_and_says_why(catalog):
    order_id, warning_id, a5 = _refused(catalog)
    now = utcnow() + timedelta(minutes=5)

    result = retry_restore(warning_id, STAMP, now)

    assert (result.outcome, result.resolved, result.lost, result.fresh) == (RestoreOutcome.REFUSED, False, False, True)
    assert result.words == "refused again by an inventory invariant; fix the cause first"
    kept = _warning(warning_id)
    assert (kept.state, kept.resolution, kept.resolved_at) == ("open", f"retry ({STAMP}): {result.words}", None)
    # The retry's own warning of the same refusal is folded into this one, not left open beside it.
    [_, copy] = warnings(order_id)
    assert (copy.state, copy.resolution, copy.resolved_at) == (
        "duplicate",
        f"same problem as warning {warning_id}",
        now,
    )
    assert on_hand(a5) == MAX_ON_HAND - 1 and order(order_id).inventory_restored is False


def test_a_retry_after_the_cause_is_fixed_restores_and_closes_the_warning(catalog):
    order_id, warning_id, a5 = _refused(catalog)
    _stock(a5, 10)
    now = utcnow() + timedelta(minutes=5)

    result = retry_restore(warning_id, STAMP, now)

    assert (result.outcome, result.words, result.error) == (RestoreOutcome.RESTORED, "stock restored", "")
    assert (result.resolved, result.lost, result.fresh) == (True, False, False)
    closed = _warning(warning_id)
    assert (closed.state, closed.resolution, closed.resolved_at) == (
        "resolved",
        f"retried ({STAMP}): stock restored",
        now,
    )
    assert on_hand(a5) == 13 and len(warnings(order_id)) == 1


def test_a_retry_that_restores_names_what_is_still_missing_in_the_resolution(catalog):
    order_id, warning_id, a5 = _refused(catalog)
    sand = catalog["MUG-350-SND"]
    _stock(a5, 10)
    db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id == sand))
    db.session.commit()

    result = retry_restore(warning_id, STAMP, utcnow())

    [_, missing] = warnings(order_id)
    assert (missing.variant_id, missing.quantity, missing.state) == (sand, 2, "open")
    words = f"stock restored; still missing: 2 unit(s) of variant {sand} (warning {missing.id})"
    assert (result.outcome, result.words, result.resolved, result.fresh) == (RestoreOutcome.RESTORED, words, True, True)
    assert _warning(warning_id).resolution == f"retried ({STAMP}): {words}"


def test_a_retry_of_a_warning_settled_meanwhile_restores_but_says_it_lost(catalog):
    order_id, warning_id, a5 = _refused(catalog)
    assert resolve_fixed_by_hand(warning_id, "first operator", "", utcnow())
    _stock(a5, 10)

    result = retry_restore(warning_id, STAMP, utcnow())

    assert (result.outcome, result.resolved, result.lost) == (RestoreOutcome.RESTORED, False, True)
    assert _warning(warning_id).resolution == "fixed by hand (first operator)"
    assert on_hand(a5) == 13 and order(order_id).inventory_restored is True


def test_a_retry_that_raises_keeps_the_warning_open_with_the_error(catalog, monkeypatch, caplog):
    order_id, warning_id, a5 = _refused(catalog)
    _stock(a5, 10)
    monkeypatch.setenv("BACKSTOP_FAILPOINTS", "restore_inventory.after_marker_flush=raise")

    with caplog.at_level(logging.WARNING, logger="shop.console"):
        result = retry_restore(warning_id, STAMP, utcnow())

    error = "RuntimeError: failpoint restore_inventory.after_marker_flush"
    # The log names the warning and what went wrong, for whoever reads the logs rather than the console.
    assert [r.getMessage() for r in caplog.records if r.name == "shop.console"] == [
        f"operator retry of restore for warning {warning_id} failed: failpoint restore_inventory.after_marker_flush"
    ]
    assert (result.outcome, result.error, result.resolved, result.fresh) == (RestoreOutcome.ERROR, error, False, False)
    assert result.words == f"the retry failed ({error})"
    kept = _warning(warning_id)
    assert (kept.state, kept.resolution) == ("open", f"retry ({STAMP}): the retry failed ({error})")
    assert on_hand(a5) == 10 and order(order_id).inventory_restored is False


def test_a_retry_of_an_unmatched_variant_warning_stays_open_and_says_to_add_the_stock_by_hand(catalog):
    a5, sand = catalog["NB-A5-DOT"], catalog["MUG-350-SND"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2})
    db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id == sand))
    db.session.commit()
    assert run_delivery(delivery_id) == "done"
    [warning] = warnings(order_id)

    result = retry_restore(warning.id, STAMP, utcnow())

    assert (result.outcome, result.resolved, result.fresh) == (RestoreOutcome.ALREADY_RESTORED, False, False)
    assert result.words == (
        f"the order's other lines were restored earlier; variant {sand} has no inventory row, so a "
        "retry cannot bring these units back. Add the stock by hand, then choose “fixed”"
    )
    assert _warning(warning.id).state == "open" and on_hand(a5) == 40


def test_a_retry_of_a_warning_whose_order_was_restored_since_closes_it_saying_so(catalog):
    """The cause was fixed and a restore ran meanwhile (a redelivery, another operator): nothing is
    left to give back, and the warning names no variant, so the retry closes it."""
    order_id, warning_id, a5 = _refused(catalog)
    _stock(a5, 10)
    assert restore_inventory_now(order_id) is RestoreOutcome.RESTORED

    result = retry_restore(warning_id, STAMP, utcnow())

    words = "the stock had already been restored"
    assert (result.outcome, result.words, result.resolved, result.fresh) == (
        RestoreOutcome.ALREADY_RESTORED,
        words,
        True,
        False,
    )
    assert _warning(warning_id).resolution == f"retried ({STAMP}): {words}" and on_hand(a5) == 13


def test_a_retry_that_restores_names_each_variant_still_missing_in_turn(catalog):
    a5, sand, navy = catalog["NB-A5-DOT"], catalog["MUG-350-SND"], catalog["MUG-350-NVY"]
    order_id, delivery_id = placed_and_cancelled({a5: 3, sand: 2, navy: 1})
    _stock(a5, MAX_ON_HAND - 1)
    assert run_delivery(delivery_id) == "done"
    [warning] = warnings(order_id)
    _stock(a5, 10)
    db.session.execute(delete(InventoryItem).where(InventoryItem.variant_id.in_([sand, navy])))
    db.session.commit()

    result = retry_restore(warning.id, STAMP, utcnow())

    missing = {w.variant_id: w.id for w in warnings(order_id)[1:]}
    assert sorted(missing) == sorted([sand, navy])
    first, second = sorted([(sand, 2), (navy, 1)])
    assert result.words == (
        f"stock restored; still missing: {first[1]} unit(s) of variant {first[0]} (warning {missing[first[0]]})"
        f"; still missing: {second[1]} unit(s) of variant {second[0]} (warning {missing[second[0]]})"
    )
    assert result.resolved is True


def test_a_retry_folds_only_its_copy_of_the_same_problem_not_a_new_problem_it_finds(catalog):
    """A warning of a variant with no stock row is retried while an invariant refuses the order's
    restore: the refusal is another problem, and stays open beside it."""
    order_id, refusal_id, a5 = _refused(catalog)
    sand = catalog["MUG-350-SND"]
    db.session.add(RestoreWarning(order_id=order_id, variant_id=sand, quantity=2, reason="no inventory row"))
    db.session.commit()
    sand_warning = warnings(order_id)[-1]

    result = retry_restore(sand_warning.id, STAMP, utcnow())

    assert (result.outcome, result.resolved, result.fresh) == (RestoreOutcome.REFUSED, False, True)
    refused_again = warnings(order_id)[-1]
    assert (refused_again.variant_id, refused_again.state) == (None, "open")
    assert _warning(sand_warning.id).state == "open" and _warning(refusal_id).state == "open"
