"""The one retry of a use case that lost the optimistic-concurrency race
(`order_store.retry_on_lost_race`): each try reads fresh state and tries once; a LostRace (or an
exception the use case names) is followed by another try, at most N in all, and what the last try
raises reaches the caller; anything else passes through at once."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from factories import force_order, place_order_for, seed_catalog_rows
from shop.domain.order import CANCELLED_BY_CUSTOMER, OrderStatus, Transition
from shop.extensions import db
from shop.models import Order
from shop.outbox import uow
from shop.store import order_store
from shop.store.loaded_order import LoadedOrder


def _lost_race() -> order_store.LostRace:
    return order_store.LostRace(LoadedOrder(7, "BK-RACE", OrderStatus.PENDING_PAYMENT, 3), Transition.CANCEL)


class Tries:
    """A use case's try that loses the race `losses` times, then answers with its attempt number."""

    def __init__(self, losses: int, exc=_lost_race):
        self.losses, self.exc, self.seen = losses, exc, []

    def __call__(self, attempt: int) -> str:
        self.seen.append(attempt)
        if len(self.seen) <= self.losses:
            raise self.exc()
        return f"answer of try {attempt}"


def test_a_lost_race_is_tried_again_and_the_next_try_answers():
    tries = Tries(losses=2)
    assert order_store.retry_on_lost_race(3, tries) == "answer of try 2"
    assert tries.seen == [0, 1, 2]


def test_a_try_that_wins_the_first_time_is_the_only_one():
    tries = Tries(losses=0)
    assert order_store.retry_on_lost_race(4, tries) == "answer of try 0"
    assert tries.seen == [0]


@pytest.mark.parametrize("attempts", [1, 2, 4])
def test_it_stops_after_n_tries_and_the_last_lost_race_reaches_the_caller(attempts):
    raised = []

    def lose(attempt):
        raised.append(_lost_race())
        raise raised[-1]

    with pytest.raises(order_store.LostRace) as lost:
        order_store.retry_on_lost_race(attempts, lose)
    assert len(raised) == attempts
    assert lost.value is raised[-1]


def test_an_exception_that_is_not_a_lost_race_passes_through_without_a_retry():
    tries = Tries(losses=1, exc=lambda: ValueError("a bug, not a race"))
    with pytest.raises(ValueError, match="a bug, not a race"):
        order_store.retry_on_lost_race(4, tries)
    assert tries.seen == [0]


def test_the_exceptions_a_use_case_names_are_retried_like_a_lost_race():
    tries = Tries(losses=3, exc=lambda: IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert order_store.retry_on_lost_race(4, tries, also=(IntegrityError,)) == "answer of try 3"
    assert tries.seen == [0, 1, 2, 3]
    with pytest.raises(IntegrityError):
        order_store.retry_on_lost_race(4, Tries(losses=1, exc=tries.exc))  # not named: not retried


def test_fewer_than_one_try_is_refused():
    with pytest.raises(ValueError, match="at least one attempt"):
        order_store.retry_on_lost_race(0, Tries(losses=0))


def test_a_save_that_lost_to_another_writer_is_retried_on_the_order_as_that_writer_left_it(fresh_ctx):
    skus = seed_catalog_rows()
    order_id = place_order_for({next(iter(sorted(skus.values()))): 1}).order_id
    db.session.remove()
    versions = []

    def cancel_once(attempt: int) -> int:
        order = order_store.read(order_id, fresh=True)
        versions.append(order.version)
        if attempt == 0:
            force_order(order_id, version=order.version + 1)  # another writer commits meanwhile
        with uow.transaction():
            order_store.save(order, Transition.CANCEL, order.cancel(CANCELLED_BY_CUSTOMER).events)
        return order.version

    assert order_store.retry_on_lost_race(2, cancel_once) == versions[1] + 1
    assert versions == [1, 2]
    db.session.remove()
    assert db.session.get(Order, order_id).status == OrderStatus.CANCELLED
