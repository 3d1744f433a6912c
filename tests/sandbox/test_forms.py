"""Stripe's bracketed form encoding, parsed the way the SDK writes it."""

from urllib.parse import parse_qsl, urlencode

import pytest

from shop.stripe_sandbox.errors import StripeError
from shop.stripe_sandbox.forms import merge_metadata, parse_form, read_int, read_metadata


def parse(pairs):
    return parse_form(parse_qsl(urlencode(pairs), keep_blank_values=True))


def test_nested_line_items_metadata_and_arrays_become_dicts_and_lists():
    params = parse(
        [
            ("mode", "payment"),
            ("line_items[0][price_data][currency]", "usd"),
            ("line_items[0][price_data][unit_amount]", "1250"),
            ("line_items[0][price_data][product_data][name]", "Mug"),
            ("line_items[0][quantity]", "2"),
            ("line_items[1][price_data][currency]", "usd"),
            ("line_items[1][quantity]", "1"),
            ("metadata[order_id]", "42"),
            ("enabled_events[0]", "*"),
            ("expand[]", "payment_intent"),
        ]
    )
    assert params["mode"] == "payment"
    assert params["line_items"][0] == {
        "price_data": {"currency": "usd", "unit_amount": "1250", "product_data": {"name": "Mug"}},
        "quantity": "2",
    }
    assert params["line_items"][1]["quantity"] == "1"
    assert params["metadata"] == {"order_id": "42"}
    assert params["enabled_events"] == ["*"]
    assert params["expand"] == ["payment_intent"]


def test_indices_are_ordered_numerically_and_metadata_keeps_digit_keys():
    params = parse([(f"a[{i}]", str(i)) for i in (10, 2, 0, 1)] + [("metadata[1]", "x")])
    assert params["a"] == ["0", "1", "2", "10"]
    assert params["metadata"] == {"1": "x"}


def test_a_key_that_is_both_a_value_and_a_hash_is_refused():
    with pytest.raises(StripeError) as refused:
        parse([("metadata", "x"), ("metadata[a]", "b")])
    assert refused.value.status == 400


def test_typed_reads_use_stripe_messages():
    with pytest.raises(StripeError, match="Invalid integer: abc"):
        read_int("abc", "amount")
    with pytest.raises(StripeError, match="greater than or equal to 1"):
        read_int("0", "amount", minimum=1)
    assert read_metadata({"a": "1", "gone": ""}) == {"a": "1"}
    assert merge_metadata({"a": "1", "b": "2"}, {"b": "", "c": "3"}) == {"a": "1", "c": "3"}
