"""The restoration arithmetic (domain.restoration.plan_restoration): which of a cancelled order's
lines the compensation may give back, which have no inventory row, and which it must refuse
(docs/REFERENCE.md, Guarantees: stock comes back exactly once, never past the column's limit)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shop.domain.restoration import MAX_ON_HAND, RestorationPlan, plan_restoration

lines_strategy = st.lists(st.tuples(st.integers(1, 8), st.integers(1, 50)), max_size=12)
on_hand_strategy = st.dictionaries(st.integers(1, 8), st.integers(0, MAX_ON_HAND), max_size=8)


@settings(max_examples=300, deadline=None)
@given(lines=lines_strategy, stock=on_hand_strategy)
def test_plan_restoration_accounts_for_every_unit_and_never_goes_negative(lines, stock):
    plan = plan_restoration(lines, stock)
    requested = {}
    for variant_id, quantity in lines:
        requested[variant_id] = requested.get(variant_id, 0) + quantity
    refused = {int(code.rsplit("=", 1)[1]) for code in plan.refusals}
    # Every requested unit is either restored, reported unmatched, or refused; nothing twice.
    for variant_id, quantity in requested.items():
        outcomes = [
            plan.increases.get(variant_id),
            plan.unmatched.get(variant_id),
            quantity if variant_id in refused else None,
        ]
        assert [o for o in outcomes if o is not None] == [quantity], (variant_id, plan)
    assert set(plan.increases) | set(plan.unmatched) | refused == set(requested)
    assert set(plan.unmatched) == {v for v in requested if v not in stock}
    # Never negative, never past the column's limit.
    assert all(q > 0 for q in plan.increases.values()) and all(q > 0 for q in plan.unmatched.values())
    assert all(0 <= stock[v] + q <= MAX_ON_HAND for v, q in plan.increases.items())
    assert all(stock[v] + requested[v] > MAX_ON_HAND for v in refused)


def test_plan_restoration_refuses_an_increase_that_would_overflow():
    plan = plan_restoration([(1, 2), (2, 1)], {1: MAX_ON_HAND - 1, 2: 0})
    assert plan.refused and plan.refusals == ("stock_would_overflow:variant=1",)


def test_plan_restoration_refuses_a_non_positive_quantity():
    assert plan_restoration([(1, 0)], {1: 5}).refusals == ("non_positive_quantity:variant=1",)


def test_plan_restoration_merges_repeated_lines_and_reports_unmatched():
    plan = plan_restoration([(1, 2), (1, 3), (9, 4)], {1: 0})
    assert (plan.increases, plan.unmatched, plan.refused) == ({1: 5}, {9: 4}, False)


def test_plan_restoration_fills_a_row_up_to_the_limit_exactly():
    plan = plan_restoration([(1, 2)], {1: MAX_ON_HAND - 2})
    assert (plan.increases, plan.refusals, plan.refused) == ({1: 2}, (), False)


def test_plan_restoration_refuses_a_negative_quantity_and_still_plans_the_other_lines():
    plan = plan_restoration([(2, -1), (1, 3), (3, 1)], {1: 4, 2: 5})
    assert plan.refusals == ("non_positive_quantity:variant=2",)
    assert (plan.increases, plan.unmatched, plan.refused) == ({1: 3}, {3: 1}, True)


def test_plan_restoration_of_no_lines_gives_nothing_back_and_refuses_nothing():
    assert plan_restoration([], {1: 5}) == RestorationPlan({}, {}, ())
