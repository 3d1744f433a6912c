"""The console's actions that need a reason (discarding a dead letter, recording a refund settled
outside the shop) refuse one that is missing or too long with a 400 in words, before anything
is done: the reason is the only record of the operator's decision."""

from __future__ import annotations

import pytest

from compensation_support import cancel_in, dead_letter
from factories import placed_order_in

JSON = {"Accept": "application/json"}
TOO_LONG = "Keep the reason under 2000 characters."
SETTLE_MISSING = "Say how this refund was settled outside the shop: the reason is the only record of it."
DISCARD_MISSING = "Say why this is discarded: the reason is the only record of the decision."


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({}, SETTLE_MISSING),
        ({"reason": "x" * 2001}, TOO_LONG),
        ({"reason": "   "}, SETTLE_MISSING),
    ],
)
def test_settling_a_refund_without_a_usable_reason_is_a_400_saying_what_to_write(fresh_client, token, form, error):
    r = fresh_client.post("/console/refunds/999/settle", data={"csrf_token": token, **form}, headers=JSON)
    assert (r.status_code, r.get_json()) == (400, {"error": error, "status": 400, "id": 999})


@pytest.mark.parametrize(("form", "error"), [({}, DISCARD_MISSING), ({"reason": "x" * 2001}, TOO_LONG)])
def test_discarding_a_dead_letter_without_a_usable_reason_is_a_400_saying_what_to_write(
    fresh_app, fresh_client, token, form, error
):
    order_id, _ = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    r = fresh_client.post(f"/console/outbox/{delivery}/discard", data={"csrf_token": token, **form}, headers=JSON)
    assert (r.status_code, r.get_json()) == (400, {"error": error, "status": 400, "id": delivery})
