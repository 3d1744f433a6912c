"""The sandbox's Stripe account (POST/GET /_sandbox/account) and what a Checkout Session takes
from it: automatic tax, Adaptive Pricing, the dynamic payment methods and voucher expiry. Each
session is created and read with the real stripe SDK; the customer's address comes with the
scripted outcome (POST /_sandbox/sessions/<id>/outcome)."""

import json

import pytest
import stripe

from sandbox.test_hosted_page_and_shapes import assert_matches_fixture, browser, new_session
from shop.stripe_sandbox.persist import StateFile
from shop.stripe_sandbox.state import Sandbox
from shop.stripe_sandbox.testing import SandboxControlError

BERLIN = {"country": "DE", "line1": "Unter den Linden 1", "city": "Berlin", "postal_code": "10117"}
BOSTON = {"country": "US", "line1": "1 Main St", "city": "Boston", "postal_code": "02110", "state": "MA"}

DEFAULTS = {
    "automatic_tax_default": "disabled",
    "tax_rates": {},
    "adaptive_pricing_default": False,
    "payment_methods": ["card"],
    "voucher_expires_after_days": 3,
    "default_api_version": "2026-10-28.endive",
    "authorization_validity_seconds": 604800,
}


def raw(obj) -> dict:
    return json.loads(obj.last_response.body)


# -- the account's settings ----------------------------------------------------------------


def test_a_fresh_sandbox_has_the_default_account(sandbox):
    assert sandbox.account() == DEFAULTS


def test_the_account_takes_any_subset_of_settings_and_answers_them_all(sandbox):
    changed = sandbox.account(tax_rates={"DE": 1900, "GB": 2000}, payment_methods=["card", "oxxo"])

    assert changed == {**DEFAULTS, "tax_rates": {"DE": 1900, "GB": 2000}, "payment_methods": ["card", "oxxo"]}
    after = sandbox.account(authorization_validity_seconds=3600, voucher_expires_after_days=5)
    assert after["tax_rates"] == {"DE": 1900, "GB": 2000} and after["authorization_validity_seconds"] == 3600
    assert sandbox.account() == after


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"automatic_tax_default": "always"}, "automatic_tax_default must be one of disabled, enabled_when_possible"),
        ({"tax_rates": {"de": 1900}}, "'de' is not a two-letter country code"),
        ({"tax_rates": {"DE": 19.5}}, "tax_rates[DE] must be whole basis points from 0 to 10000"),
        ({"tax_rates": ["DE"]}, "tax_rates must be an object"),
        ({"adaptive_pricing_default": "yes"}, "adaptive_pricing_default must be true or false"),
        ({"payment_methods": []}, "payment_methods must be a non-empty list"),
        ({"payment_methods": ["card", "cheque"]}, "'cheque' is not a payment method type"),
        ({"payment_methods": ["card", "card"]}, "payment_methods lists a type twice"),
        ({"voucher_expires_after_days": 8}, "voucher_expires_after_days must be a whole number of days from 1 to 7"),
        ({"default_api_version": "latest"}, "default_api_version must be an API version"),
        ({"authorization_validity_seconds": 0}, "authorization_validity_seconds must be a whole number from 1"),
        ({"authorization_validity_seconds": True}, "authorization_validity_seconds must be a whole number"),
        ({"currency": "eur"}, "Unknown field(s): currency"),
    ],
)
def test_a_bad_setting_is_a_400_naming_it_and_changes_nothing(sandbox, changes, words):
    with pytest.raises(SandboxControlError) as refused:
        sandbox.account(**{"tax_rates": {"FR": 2000}, **changes})

    assert refused.value.status == 400 and words in refused.value.message
    assert sandbox.account() == DEFAULTS


def test_a_reset_puts_the_account_back_to_its_defaults(sandbox):
    sandbox.account(automatic_tax_default="enabled_when_possible", payment_methods=["card", "konbini"])
    sandbox.reset()
    assert sandbox.account() == DEFAULTS


def test_the_state_file_keeps_the_account_and_an_older_file_without_one_loads_the_defaults(sandbox, tmp_path):
    sandbox.account(tax_rates={"DE": 1900}, adaptive_pricing_default=True)
    path = tmp_path / "state.json"
    StateFile(sandbox.sandbox, str(path)).save()

    restarted = Sandbox(60, start_threads=False)
    StateFile(restarted, str(path)).load()
    assert restarted.account.as_dict() == {**DEFAULTS, "tax_rates": {"DE": 1900}, "adaptive_pricing_default": True}

    older = json.loads(path.read_text())
    del older["account"]
    path.write_text(json.dumps(older))
    again = Sandbox(60, start_threads=False)
    assert StateFile(again, str(path)).load().startswith("loaded")
    assert again.account.as_dict() == DEFAULTS
    restarted.close()
    again.close()


# -- automatic tax -------------------------------------------------------------------------


def test_without_tax_a_session_still_carries_its_subtotal_and_total_details(client, sandbox):
    session = raw(new_session(client))

    assert session["automatic_tax"] == {"enabled": False, "liability": None, "provider": None, "status": None}
    assert session["amount_subtotal"] == 2500 and session["amount_total"] == 2500
    assert session["total_details"] == {"amount_discount": 0, "amount_shipping": 0, "amount_tax": 0}


def test_the_accounts_tax_default_applies_until_the_address_is_known_then_adds_exclusive_tax(client, sandbox):
    sandbox.account(automatic_tax_default="enabled_when_possible", tax_rates={"DE": 1900})
    session = new_session(client)
    created = raw(session)
    assert created["automatic_tax"] == {
        "enabled": True,
        "liability": {"type": "self"},
        "provider": "stripe",
        "status": "requires_location_inputs",
    }
    assert created["amount_total"] == 2500 and created["total_details"]["amount_tax"] == 0

    paid = sandbox.set_outcome(session.id, "paid", address=BERLIN)

    assert paid["automatic_tax"]["status"] == "complete"
    assert paid["amount_subtotal"] == 2500 and paid["total_details"]["amount_tax"] == 475
    assert paid["amount_total"] == 2975
    assert paid["customer_details"]["address"] == {**BERLIN, "line2": None, "state": None}
    intent = client.v1.payment_intents.retrieve(paid["payment_intent"])
    assert intent.amount == 2975 and intent.amount_received == 2975
    charge = client.v1.checkout.sessions.retrieve(
        session.id, params={"expand": ["payment_intent.latest_charge"]}
    ).payment_intent.latest_charge
    assert charge.amount == 2975
    assert_matches_fixture("checkout.session", raw(client.v1.checkout.sessions.retrieve(session.id)))


def test_tax_rounds_half_up_to_the_smallest_unit_and_a_country_without_a_rate_pays_none(client, sandbox):
    sandbox.account(tax_rates={"GB": 2000, "DE": 1925})
    taxed = new_session(client, automatic_tax={"enabled": True}, line_items=[_line(1000)])
    untaxed = new_session(client, automatic_tax={"enabled": True}, line_items=[_line(1001)])

    # 1000 x 19.25 % = 192.5: half up, not to even
    assert sandbox.set_outcome(taxed.id, "paid", address={"country": "DE"})["total_details"]["amount_tax"] == 193
    elsewhere = sandbox.set_outcome(untaxed.id, "paid", address=BOSTON)
    assert elsewhere["automatic_tax"]["status"] == "complete"
    assert elsewhere["total_details"]["amount_tax"] == 0 and elsewhere["amount_total"] == 1001


def test_an_explicit_automatic_tax_enabled_always_wins_over_the_account_default(client, sandbox):
    sandbox.account(automatic_tax_default="enabled_when_possible", tax_rates={"DE": 1900})
    off = new_session(client, automatic_tax={"enabled": False})
    assert raw(off)["automatic_tax"]["enabled"] is False
    assert sandbox.set_outcome(off.id, "paid", address=BERLIN)["amount_total"] == 2500

    sandbox.account(automatic_tax_default="disabled")
    on = new_session(client, automatic_tax={"enabled": True})
    assert raw(on)["automatic_tax"]["status"] == "requires_location_inputs"
    assert sandbox.set_outcome(on.id, "paid", address=BERLIN)["amount_total"] == 2975


def test_tax_on_a_collecting_session_follows_the_shipping_address(client, sandbox):
    sandbox.account(tax_rates={"GB": 2000, "DE": 1900})
    session = new_session(
        client, automatic_tax={"enabled": True}, shipping_address_collection={"allowed_countries": ["GB", "DE"]}
    )
    ship_to = {"name": "Ada", "line1": "1 High St", "city": "London", "postal_code": "N1 1AA", "country": "GB"}

    paid = sandbox.set_outcome(session.id, "paid", shipping_address=ship_to, address=BERLIN)

    assert paid["total_details"]["amount_tax"] == 500 and paid["amount_total"] == 3000


def test_a_collecting_session_given_only_the_customers_address_ships_there_and_refuses_a_country_it_does_not_ship_to(
    client, sandbox
):
    session = new_session(client, shipping_address_collection={"allowed_countries": ["DE"]})
    with pytest.raises(SandboxControlError) as refused:
        sandbox.set_outcome(session.id, "paid", address=BOSTON)
    assert refused.value.status == 400 and "We do not ship to US" in refused.value.message

    paid = sandbox.set_outcome(session.id, "paid", address=BERLIN)
    shipped = paid["collected_information"]["shipping_details"]
    assert shipped["address"]["country"] == "DE" and shipped["address"]["line1"] == "Unter den Linden 1"


def test_a_declined_card_already_prices_the_payment_for_the_address_and_a_retry_elsewhere_reprices_it(client, sandbox):
    sandbox.account(tax_rates={"DE": 1900, "GB": 2000})
    session = new_session(client, automatic_tax={"enabled": True})

    declined = sandbox.set_outcome(session.id, "declined", address=BERLIN)
    assert declined["status"] == "open" and declined["amount_total"] == 2975
    paid = sandbox.set_outcome(session.id, "paid", address={"country": "GB"})

    assert paid["amount_total"] == 3000
    assert client.v1.payment_intents.retrieve(paid["payment_intent"]).amount_received == 3000


def test_a_session_with_tax_paid_on_the_hosted_page_is_taxed_where_it_ships(client, sandbox):
    sandbox.account(automatic_tax_default="enabled_when_possible", tax_rates={"GB": 2000, "US": 500})
    session = new_session(client, shipping_address_collection={"allowed_countries": ["GB"]})
    form = {"name": "Ada", "line1": "1 High St", "city": "London", "postal_code": "N1 1AA", "country": "GB"}

    assert browser(sandbox, "POST", f"/pay/{session.id}", {**form, "choice": "pay"})[0] == 303

    paid = client.v1.checkout.sessions.retrieve(session.id, params={"expand": ["payment_intent"]})
    assert paid.automatic_tax.status == "complete" and paid.total_details.amount_tax == 500
    assert paid.amount_total == 3000 and paid.payment_intent.amount_received == 3000


def test_a_session_with_tax_paid_without_an_address_is_taxed_where_the_sandbox_customer_lives(client, sandbox):
    sandbox.account(tax_rates={"US": 500})
    session = new_session(client, automatic_tax={"enabled": True})

    paid = sandbox.set_outcome(session.id, "paid")

    assert paid["automatic_tax"]["status"] == "complete" and paid["total_details"]["amount_tax"] == 125
    assert paid["customer_details"]["address"]["country"] == "US"


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ({"line1": "No country"}, "address.country must be a two-letter country code"),
        ({"country": "DEU"}, "address.country must be a two-letter country code"),
        ({"country": "DE", "zip": "10117"}, "Unknown address field(s): zip"),
        ({"country": "DE", "city": 7}, "address.city must be a string"),
    ],
)
def test_a_bad_address_is_a_400_and_the_session_stays_open(client, sandbox, address, words):
    session = new_session(client)
    with pytest.raises(SandboxControlError) as refused:
        sandbox.set_outcome(session.id, "paid", address=address)

    assert refused.value.status == 400 and words in refused.value.message
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"


def test_automatic_tax_liability_other_than_self_is_refused_naming_the_param(client, sandbox):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        new_session(client, automatic_tax={"enabled": True, "liability": {"type": "account"}})
    assert refused.value.param == "automatic_tax[liability][type]"


# -- Adaptive Pricing ----------------------------------------------------------------------


def test_adaptive_pricing_shows_a_customer_abroad_their_currency_and_keeps_the_sessions(client, sandbox):
    sandbox.account(adaptive_pricing_default=True)
    session = new_session(client)
    assert raw(session)["adaptive_pricing"] == {"enabled": True}
    assert "presentment_details" not in raw(session)

    paid = sandbox.set_outcome(session.id, "paid", address={"country": "JP"})

    assert paid["currency"] == "usd" and paid["amount_total"] == 2500
    assert paid["presentment_details"] == {"presentment_amount": 3750, "presentment_currency": "jpy"}
    assert_matches_fixture("checkout.session", paid, extra=("presentment_details",))
    assert client.v1.payment_intents.retrieve(paid["payment_intent"]).amount == 2500


def test_adaptive_pricing_converts_the_total_with_its_tax_and_not_for_a_customer_in_the_same_currency(client, sandbox):
    sandbox.account(tax_rates={"DE": 1900})
    abroad = new_session(client, adaptive_pricing={"enabled": True}, automatic_tax={"enabled": True})
    at_home = new_session(client, adaptive_pricing={"enabled": True})

    paid = sandbox.set_outcome(abroad.id, "paid", address=BERLIN)
    assert paid["presentment_details"] == {"presentment_amount": 2737, "presentment_currency": "eur"}
    assert "presentment_details" not in sandbox.set_outcome(at_home.id, "paid", address=BOSTON)


def test_an_explicit_adaptive_pricing_disabled_wins_over_the_account_default(client, sandbox):
    sandbox.account(adaptive_pricing_default=True)
    session = new_session(client, adaptive_pricing={"enabled": False})

    assert raw(session)["adaptive_pricing"] == {"enabled": False}
    assert "presentment_details" not in sandbox.set_outcome(session.id, "paid", address=BERLIN)


# -- payment methods -----------------------------------------------------------------------


def test_a_create_with_payment_method_types_is_refused_as_stripe_refuses_it_since_endive(client, sandbox):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        new_session(client, payment_method_types=["card"])

    assert refused.value.http_status == 400 and refused.value.param == "payment_method_types"
    assert refused.value.code == "payment_method_types_no_longer_supported"
    assert client.v1.checkout.sessions.list().data == []


def test_a_session_offers_the_accounts_dynamic_payment_methods_narrowed_as_asked(client, sandbox):
    sandbox.account(payment_methods=["card", "oxxo", "klarna"])

    assert raw(new_session(client))["payment_method_types"] == ["card", "oxxo", "klarna"]
    allowed = new_session(client, allowed_payment_method_types=["klarna", "card"])
    assert raw(allowed)["payment_method_types"] == ["card", "klarna"]
    excluded = new_session(client, excluded_payment_method_types=["klarna", "paypal"])
    assert raw(excluded)["payment_method_types"] == ["card", "oxxo"]
    # A filter, as Stripe documents it: a type the account does not offer is not offered.
    assert raw(new_session(client, allowed_payment_method_types=["card", "paypal"]))["payment_method_types"] == ["card"]
    paid = sandbox.set_outcome(excluded.id, "paid")
    assert client.v1.payment_intents.retrieve(paid["payment_intent"]).payment_method_types == ["card", "oxxo"]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (
            {"allowed_payment_method_types": ["card"], "excluded_payment_method_types": ["oxxo"]},
            "excluded_payment_method_types",
        ),
        ({"allowed_payment_method_types": ["paypal", "klarna"]}, "allowed_payment_method_types"),
        ({"allowed_payment_method_types": ["cheque"]}, "allowed_payment_method_types[0]"),
        ({"excluded_payment_method_types": ["card", "oxxo"]}, "excluded_payment_method_types"),
        (
            {"payment_method_options": {"oxxo": {"expires_after_days": 8}}},
            "payment_method_options[oxxo][expires_after_days]",
        ),
        (
            {"payment_method_options": {"card": {"request_three_d_secure": "any"}}},
            "payment_method_options[card][request_three_d_secure]",
        ),
    ],
)
def test_a_payment_method_choice_the_account_cannot_meet_is_refused_naming_the_param(client, sandbox, params, param):
    sandbox.account(payment_methods=["card", "oxxo"])
    with pytest.raises(stripe.InvalidRequestError) as refused:
        new_session(client, **params)

    assert refused.value.http_status == 400 and refused.value.param == param
    assert client.v1.checkout.sessions.list().data == []


def test_vouchers_expire_after_the_days_asked_else_the_accounts(client, sandbox):
    sandbox.account(payment_methods=["card", "oxxo", "boleto", "konbini"], voucher_expires_after_days=5)

    session = new_session(
        client,
        payment_method_options={"boleto": {"expires_after_days": 30}, "konbini": {"expires_after_days": 10}},
        allowed_payment_method_types=["card", "oxxo", "boleto"],
    )

    assert raw(session)["payment_method_options"] == {
        "oxxo": {"expires_after_days": 5},
        "boleto": {"expires_after_days": 30},
    }
    assert (
        raw(new_session(client, excluded_payment_method_types=["oxxo", "boleto", "konbini"]))["payment_method_options"]
        == {}
    )


def _line(unit_amount: int) -> dict:
    return {
        "price_data": {"currency": "usd", "unit_amount": unit_amount, "product_data": {"name": "Mug"}},
        "quantity": 1,
    }
