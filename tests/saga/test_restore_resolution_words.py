"""What a restore warning's resolution says of the compensation's outcome is words an operator
reads on the console (docs/REFERENCE.md, Console), never the outcome's code or an order state's."""

from __future__ import annotations

import re

from shop.domain.order import OrderStatus
from shop.saga.inventory import RestoreOutcome
from shop.saga.warnings import _said


def test_every_outcome_of_a_retried_restore_is_said_in_words_without_a_code():
    # The codes that are not also English words: `not_cancelled`, `PaymentInitiated`, ...
    codes = {c for c in {str(o) for o in RestoreOutcome} | {str(s) for s in OrderStatus} if "_" in c or c != c.lower()}
    assert "not_cancelled" in codes and "PaymentInitiated" in codes
    for outcome in RestoreOutcome:
        words = _said(outcome, "OperationalError: the database went away")
        assert words and not any(re.search(rf"\b{re.escape(code)}\b", words) for code in codes), (outcome, words)
