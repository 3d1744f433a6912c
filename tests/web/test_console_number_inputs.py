"""An operator's number is ASCII digits within what the column holds, or a refusal in words: never
a 500 (docs/REFERENCE.md, Console). Each case is an input a security review sent that answered
500: an exponent whose scaling overflows, a superscript digit that str.isdigit() takes and int()
refuses, digits of another script."""

from __future__ import annotations

import pytest

from shop.console.money_actions import parse_amount
from support import log_in

JSON = {"Accept": "application/json"}


@pytest.mark.parametrize(
    "typed,expected",
    [
        ("12.50", (1250, None)),
        ("1,500", (150000, None)),
        (".5", (50, None)),
        ("1e999999", (None, "'1e999999' is not an amount: type it like 12.50.")),
        ("1E2", (None, "'1E2' is not an amount: type it like 12.50.")),
        ("\u0661\u0662", (None, "'\u0661\u0662' is not an amount: type it like 12.50.")),  # Arabic-Indic 12
        ("NaN", (None, "'NaN' is not an amount: type it like 12.50.")),
        ("-5", (None, "'-5' is not an amount: type it like 12.50.")),
        ("99999999999", (None, "That amount is larger than any order.")),
        ("0.001", (None, "USD amounts have 2 decimal places at most.")),
        ("0", (None, "The amount to refund must be more than zero.")),
    ],
)
def test_a_typed_refund_amount_is_ascii_digits_and_a_point_or_a_refusal_in_words(typed, expected):
    assert parse_amount(typed, "usd") == expected


@pytest.mark.parametrize("hours", ["\u00b2", "\u0664", "4" * 40, "-1", "1.5"])
def test_a_card_acknowledgement_with_hours_that_are_not_ascii_digits_is_refused_in_words(
    fresh_paying_app, fresh_client, hours
):
    token = log_in(fresh_paying_app, fresh_client)
    r = fresh_client.post(
        "/console/cards/rejected_webhooks/acknowledge",
        data={"csrf_token": token, "reason": "looking into it", "hours": hours},
        headers=JSON,
    )
    assert r.status_code == 400, r.get_data(as_text=True)
    assert "Hours must be a whole number from 1 to 168" in r.get_json()["error"]


@pytest.mark.parametrize("page", ["\u00b2", "\u0663", "9" * 40, "-3", "abc"])
def test_a_console_list_page_number_that_is_not_ascii_digits_reads_as_the_first_page(
    fresh_paying_app, fresh_client, page
):
    log_in(fresh_paying_app, fresh_client)
    r = fresh_client.get("/console/orders", query_string={"page": page}, headers=JSON)
    assert r.status_code == 200, r.get_data(as_text=True)
