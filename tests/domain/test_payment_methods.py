"""Which payment method types a checkout may offer (shop.domain.payment_methods), without a database:
the ones confirmed while the customer is on the page, and why the others are refused."""

from __future__ import annotations

import pytest

from shop.domain.payment_methods import DEFAULT_PAYMENT_METHODS, DELAYED, IMMEDIATE, refusal


@pytest.mark.parametrize("method", ["card", "link", "ideal", "klarna"])
def test_a_method_confirmed_on_the_payment_page_may_be_offered(method):
    assert refusal(method) is None


@pytest.mark.parametrize("method", ["oxxo", "sepa_debit", "customer_balance"])
def test_a_method_whose_money_arrives_later_is_refused_with_why(method):
    words = refusal(method)
    assert words == f"{method} is {DELAYED[method]}: its money could arrive after an order's pay-by time"


def test_a_method_the_shop_does_not_know_is_refused_as_unknown():
    assert refusal("carrier_pigeon") == "carrier_pigeon is not a payment method type this shop knows"


def test_the_default_methods_may_all_be_offered_and_no_method_is_both_kinds():
    assert all(refusal(method) is None for method in DEFAULT_PAYMENT_METHODS)
    assert not IMMEDIATE & set(DELAYED)
