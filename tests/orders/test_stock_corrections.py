"""An operator's stock correction against the real database: a change applies on top of whatever
checkouts did meanwhile, a count set is refused when the stock moved since it was seen, each
correction is recorded (who, old -> new, why) once however often it is submitted, and checkouts
racing corrections lose no decrement (PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from factories import cart_with, catalog_rows, on_hand, place_order_for
from shop.extensions import db
from shop.models import StockCorrection
from shop.orders.checkout import place_order
from shop.orders.stock import CorrectionOutcome, StockMode, correct_stock
from support import run_threads

OPERATOR = "night-shift@example.com"


def history(variant_id: int) -> list[tuple]:
    db.session.rollback()
    rows = db.session.execute(
        select(StockCorrection).where(StockCorrection.variant_id == variant_id).order_by(StockCorrection.id)
    ).scalars()
    return [(c.operator, c.mode, c.old_on_hand, c.new_on_hand, c.reason) for c in rows]


def correct(variant, mode, value, key, *, seen=None, reason="shelf count"):
    return correct_stock(
        variant, mode=StockMode(mode), value=value, seen=seen, reason=reason, operator=OPERATOR, request_key=key
    )


def test_an_adjustment_applies_on_top_of_a_checkout_made_after_the_page_was_seen(fresh_ctx):
    (variant,) = catalog_rows(10)
    place_order_for({variant: 3})  # the operator's page still says 10
    result = correct(variant, "adjust", +5, "key-adjust-000000001", reason="found a box")
    assert (result.outcome, result.old, result.new) == (CorrectionOutcome.DONE, 7, 12)
    assert on_hand(variant) == 12
    assert history(variant) == [(OPERATOR, "adjust", 7, 12, "found a box")]


def test_a_count_set_is_refused_when_a_checkout_moved_the_stock_since_it_was_seen(fresh_ctx):
    (variant,) = catalog_rows(10)
    place_order_for({variant: 2})
    result = correct(variant, "set", 4, "key-set-stale-0000001", seen=10)
    assert (result.outcome, result.why, result.on_hand) == (CorrectionOutcome.REFUSED, "changed", 8)
    assert on_hand(variant) == 8 and history(variant) == []
    fresh = correct(variant, "set", 4, "key-set-fresh-0000001", seen=8)
    assert (fresh.outcome, fresh.old, fresh.new) == (CorrectionOutcome.DONE, 8, 4)
    assert on_hand(variant) == 4


def test_a_count_set_without_the_count_seen_replaces_what_the_stock_holds_and_records_it(fresh_ctx):
    (variant,) = catalog_rows(10)
    place_order_for({variant: 2})
    result = correct(variant, "set", 4, "key-set-blind-0000001", seen=None, reason="full recount")
    assert (result.outcome, result.old, result.new) == (CorrectionOutcome.DONE, 8, 4)
    assert on_hand(variant) == 4
    assert history(variant) == [(OPERATOR, "set", 8, 4, "full recount")]


def test_the_same_correction_submitted_twice_corrects_once(fresh_ctx):
    (variant,) = catalog_rows(10)
    first = correct(variant, "adjust", -3, "key-twice-0000000001")
    again = correct(variant, "adjust", -3, "key-twice-0000000001")
    assert (first.outcome, again.outcome) == (CorrectionOutcome.DONE, CorrectionOutcome.ALREADY)
    assert again.correction_id == first.correction_id
    assert on_hand(variant) == 7 and len(history(variant)) == 1


@pytest.mark.parametrize(
    "mode, value, seen, reason, why",
    [
        ("adjust", -11, None, "broken", "negative"),
        ("set", -1, 10, "typo", "negative"),
        ("adjust", 0, None, "nothing", "no_change"),
        ("set", 10, 10, "same", "no_change"),
        ("adjust", 2, None, "   ", "no_reason"),
        ("set", 3_000_000_000, 10, "huge", "too_large"),
    ],
)
def test_a_correction_that_makes_no_sense_is_refused_and_changes_nothing(fresh_ctx, mode, value, seen, reason, why):
    (variant,) = catalog_rows(10)
    result = correct(variant, mode, value, f"key-refused-{why}-0001", seen=seen, reason=reason)
    assert (result.outcome, result.why, result.on_hand) == (CorrectionOutcome.REFUSED, why, 10)
    assert on_hand(variant) == 10 and history(variant) == []


def test_a_correction_of_a_variant_without_stock_is_missing(fresh_ctx):
    result = correct(987654, "adjust", 1, "key-missing-00000001")
    assert result.outcome is CorrectionOutcome.MISSING


@pytest.mark.postgres
def test_corrections_racing_checkouts_lose_no_decrement(fresh_app, is_postgres):
    if not is_postgres:
        pytest.skip("the race is PostgreSQL's")
    with fresh_app.app_context():
        (variant,) = catalog_rows(20)
        carts = [cart_with([(variant, 1)]) for _ in range(12)]
    jobs = [("checkout", c) for c in carts] + [("adjust", i) for i in range(6)]

    def work(job):
        kind, arg = job
        if kind == "checkout":
            return ("checkout", place_order(cart_id=arg[0], browser_id=arg[1], email=f"{arg[1]}@example.com").ok)
        return ("adjust", correct(variant, "adjust", +2, f"key-race-adjust-{arg:04d}").outcome)

    results, errors = run_threads(fresh_app, jobs, work)
    assert errors == [None] * len(jobs), [repr(e) for e in errors if e]
    sold = sum(1 for kind, ok in results if kind == "checkout" and ok)
    added = sum(2 for kind, outcome in results if kind == "adjust" and outcome is CorrectionOutcome.DONE)
    assert (sold, added) == (12, 12)
    with fresh_app.app_context():
        assert on_hand(variant) == 20 - sold + added
        assert len(history(variant)) == 6
