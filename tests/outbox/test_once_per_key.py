"""uow.once_per_key, the one answer of an operator's submission that lost the race for its request
key (stock corrections, email resends, operator refunds), against a real unique index: the
loser's insert is refused by the database, rolled back, and answered with what the winner did;
a refusal no earlier submission explains is raised."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from factories import catalog_rows
from shop.extensions import db
from shop.models import StockCorrection
from shop.outbox import uow

KEY = "key-once-000000001"


def _correction(variant: int, new: int) -> StockCorrection:
    """A submission's row under KEY (the same key twice is refused by the unique index)."""
    with uow.transaction() as session:
        row = StockCorrection(
            variant_id=variant, operator="ops", mode="set", old_on_hand=5, new_on_hand=new, reason="r", request_key=KEY
        )
        session.add(row)
    return row


def _corrections() -> list[int]:
    values = db.session.execute(select(StockCorrection.new_on_hand).order_by(StockCorrection.id)).scalars().all()
    db.session.rollback()
    return list(values)


def test_a_submission_whose_key_was_taken_is_answered_with_what_the_winner_did(fresh_ctx):
    (variant,) = catalog_rows(5)
    _correction(variant, 7)  # the winner, committed first

    answer = uow.once_per_key(lambda: _correction(variant, 9), lambda: "the winner's answer")

    assert answer == "the winner's answer"
    assert _corrections() == [7]  # the loser's row rolled back whole


def test_a_refusal_no_earlier_submission_explains_is_raised(fresh_ctx):
    (variant,) = catalog_rows(5)
    _correction(variant, 7)

    with pytest.raises(IntegrityError):
        uow.once_per_key(lambda: _correction(variant, 9), lambda: None)
    assert _corrections() == [7]


def test_a_submission_that_wins_is_its_own_answer_and_asks_for_no_earlier_one(fresh_ctx):
    (variant,) = catalog_rows(5)
    asked = []

    answer = uow.once_per_key(lambda: _correction(variant, 7).new_on_hand, lambda: asked.append("earlier"))

    assert (answer, asked) == (7, [])
    assert db.session.execute(select(func.count()).select_from(StockCorrection)).scalar_one() == 1
