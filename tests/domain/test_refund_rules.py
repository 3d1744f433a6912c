"""A refund's rules without Flask or a database: whatever order the provider's news arrives in, and
however often, a refund ends in the state the provider last gave its current attempt."""

from __future__ import annotations

import itertools

import pytest

from shop.domain.refunds import (
    CANCELED,
    FAILED,
    PENDING,
    SUCCEEDED,
    PaidAndRefunded,
    after_report,
    charged_for,
    needs_operator,
    paid_and_refunded,
    reported_status,
)


@pytest.mark.parametrize(
    "raw, status",
    [
        ("pending", PENDING),
        ("succeeded", SUCCEEDED),
        ("failed", FAILED),
        ("canceled", CANCELED),
        (None, PENDING),
        ("requires_action", PENDING),
        ("", PENDING),
        (3, PENDING),
        ("SUCCEEDED", PENDING),
    ],
)
def test_the_providers_status_is_one_of_four_and_anything_unknown_is_still_pending(raw, status):
    assert reported_status(raw) == status


def test_a_pending_refund_takes_any_final_answer_and_a_final_one_keeps_it():
    for final in (SUCCEEDED, FAILED, CANCELED):
        assert after_report(PENDING, final) == final
        assert after_report(final, PENDING) is None  # a stale "still pending" changes nothing
        assert after_report(final, final) is None  # a repeat changes nothing
    assert after_report(FAILED, SUCCEEDED) is None and after_report(CANCELED, SUCCEEDED) is None
    assert after_report(FAILED, CANCELED) is None


def test_a_refund_the_bank_sends_back_after_it_succeeded_becomes_failed():
    assert after_report(SUCCEEDED, FAILED) == FAILED
    assert after_report(SUCCEEDED, CANCELED) is None


@pytest.mark.parametrize(
    "news",
    [
        (PENDING, FAILED, FAILED),  # refund.updated and refund.failed for one failure
        (SUCCEEDED, FAILED),  # succeeded, then returned by the bank
    ],
)
def test_every_order_of_arrival_ends_where_the_provider_ended(news):
    final = news[-1]
    for arrival in itertools.permutations(news):
        status = PENDING
        for reported in arrival:
            status = after_report(status, reported) or status
        assert status == final, arrival  # a stale success arriving after the failure does not undo it


def test_only_money_that_did_not_go_back_and_was_not_settled_needs_an_operator():
    assert needs_operator(FAILED, settled=False) and needs_operator(CANCELED, settled=False)
    assert not needs_operator(FAILED, settled=True)
    assert not any(needs_operator(s, settled=False) for s in (PENDING, SUCCEEDED))


def test_a_payment_charged_what_it_recorded_or_the_total_when_it_recorded_nothing():
    assert charged_for(2400, 2688) == 2688  # the total plus its tax
    assert charged_for(2400, None) == 2400  # saved before the charge was recorded
    assert charged_for(2400, 0) == 0  # a recorded zero is a charge, not a missing one


@pytest.mark.parametrize(
    "refunded, shown",
    [
        (-5, PaidAndRefunded.PAID),  # nothing went back (a negative sum is no refund)
        (0, PaidAndRefunded.PAID),
        (1, PaidAndRefunded.PARTIALLY_REFUNDED),  # one cent back is a partial refund
        (2687, PaidAndRefunded.PARTIALLY_REFUNDED),
        (2688, PaidAndRefunded.REFUNDED),  # exactly the charge: all of it
        (3000, PaidAndRefunded.REFUNDED),
    ],
)
def test_a_paid_order_shows_paid_partially_refunded_or_refunded_by_what_went_back(refunded, shown):
    assert paid_and_refunded(2688, refunded) is shown
