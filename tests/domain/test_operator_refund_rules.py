"""The rules of an operator's refund of a paid order, without Flask or a database: how much is
left to refund, which amounts are refused and why, and the restock marker a paid order shares
with the compensation (set once, only on a paid order)."""

from __future__ import annotations

import pytest

from shop.domain.order import OrderRules, OrderStatus
from shop.domain.refunds import refund_amount_problem, refundable
from shop.domain.results import Ok, Refused

S = OrderStatus


class PlainOrder(OrderRules):
    def __init__(self, status: OrderStatus, restored: bool = False):
        self.id, self.status, self.inventory_restored, self.payment_session_id = 7, status, restored, "cs_1"


@pytest.mark.parametrize(
    "paid, refunded, left", [(4400, [], 4400), (4400, [400, 1000], 3000), (4400, [4400], 0), (4400, [4000, 900], 0)]
)
def test_what_is_left_to_refund_is_what_was_paid_less_every_refund_never_below_zero(paid, refunded, left):
    assert refundable(paid, refunded) == left


@pytest.mark.parametrize(
    "amount, left, problem",
    [
        (None, 100, "not_positive"),
        (0, 100, "not_positive"),
        (-5, 100, "not_positive"),
        (1, 0, "nothing_left"),
        (101, 100, "over_refundable"),
        (100, 100, None),
        (1, 100, None),
    ],
)
def test_a_refund_amount_must_be_positive_and_within_what_is_left(amount, left, problem):
    assert refund_amount_problem(amount, left) == problem


def test_a_paid_order_is_restocked_once_and_the_compensations_marker_then_refuses_too():
    order = PlainOrder(S.PAID)
    first = order.restock_paid()
    assert isinstance(first, Ok) and order.inventory_restored is True
    assert first.events == ()  # the marker is no transition of state: no event
    again = order.restock_paid()
    assert isinstance(again, Refused) and again.code == "inventory_already_restored"
    assert order.status is S.PAID


@pytest.mark.parametrize("state", [s for s in S if s is not S.PAID], ids=lambda s: s.value)
def test_only_a_paid_order_is_restocked_with_a_refund(state):
    order = PlainOrder(state)
    result = order.restock_paid()
    assert isinstance(result, Refused) and result.code == "order_not_paid"
    assert order.inventory_restored is False


def test_a_refund_of_the_last_unit_left_is_allowed():
    assert (refund_amount_problem(1, 1), refund_amount_problem(2, 1)) == (None, "over_refundable")


def test_the_restock_markers_answers_are_whole_values_with_their_words():
    order = PlainOrder(S.PAID)
    assert order.restock_paid() == Ok(())
    assert order.restock_paid() == Refused("inventory_already_restored", "this order's stock was already restored")
    assert PlainOrder(S.CANCELLED).restock_paid() == Refused(
        "order_not_paid", "only a paid order is restocked with a refund", {"status": "Cancelled"}
    )
