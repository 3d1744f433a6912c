"""A session created with `shipping_address_collection`: the hosted page asks for an address in
one of its allowed countries, checks it, and the session carries it as Stripe's does
(`collected_information.shipping_details`); a session created without it asks nothing."""

import json

import pytest
import stripe

from sandbox.test_hosted_page_and_shapes import assert_matches_fixture, browser, new_session
from shop.stripe_sandbox.testing import SandboxControlError

ADDRESS = {
    "name": "Ada Lovelace",
    "line1": "12 St James's Square",
    "line2": "Flat 3",
    "city": "London",
    "postal_code": "SW1Y 4JH",
    "state": "",
    "country": "GB",
}


def shipping_session(client, countries=("GB", "IE")):
    return new_session(client, shipping_address_collection={"allowed_countries": list(countries)})


def raw(obj) -> dict:
    return json.loads(obj.last_response.body)


def test_a_session_created_with_shipping_collection_says_so_and_has_collected_nothing_yet(client, sandbox):
    session = raw(shipping_session(client))

    assert session["shipping_address_collection"] == {"allowed_countries": ["GB", "IE"]}
    assert session["collected_information"] is None
    assert_matches_fixture("checkout.session", session)


def test_a_session_created_without_it_collects_no_address_and_its_page_asks_none(client, sandbox):
    session = new_session(client)
    body = raw(session)
    assert body["shipping_address_collection"] is None and body["collected_information"] is None

    _, _, html = browser(sandbox, "GET", f"/pay/{session.id}")
    assert "Shipping address" not in html and 'name="line1"' not in html
    assert browser(sandbox, "POST", f"/pay/{session.id}", {"choice": "pay"})[0] == 303
    assert raw(client.v1.checkout.sessions.retrieve(session.id))["collected_information"] is None


@pytest.mark.parametrize(
    ("collection", "param"),
    [
        ({"allowed_countries": ["gb"]}, "shipping_address_collection[allowed_countries][0]"),
        ({"allowed_countries": ["GB", "USA"]}, "shipping_address_collection[allowed_countries][1]"),
        ({"allowed_countries": ""}, "shipping_address_collection[allowed_countries]"),
        ({"countries": ["GB"]}, "shipping_address_collection[countries]"),
    ],
)
def test_a_bad_allowed_countries_is_refused_naming_the_param(client, sandbox, collection, param):
    with pytest.raises(stripe.InvalidRequestError) as refused:
        new_session(client, shipping_address_collection=collection)
    assert refused.value.param == param


def test_the_hosted_page_asks_for_the_address_with_labelled_fields_and_the_allowed_countries(client, sandbox):
    session = shipping_session(client)
    status, _, html = browser(sandbox, "GET", f"/pay/{session.id}")

    assert status == 200 and "<legend>Shipping address</legend>" in html
    for field in ("name", "line1", "line2", "city", "postal_code", "state", "country"):
        assert f'<label for="ship-{field}">' in html and f'id="ship-{field}" name="{field}"' in html
    assert '<option value="GB">United Kingdom</option>' in html
    assert '<option value="IE">Ireland</option>' in html
    assert 'value="US"' not in html  # only the allowed countries are offered


def test_paying_without_an_address_is_refused_in_words_and_the_session_stays_open(client, sandbox):
    session = shipping_session(client)
    status, location, html = browser(sandbox, "POST", f"/pay/{session.id}", {"choice": "pay", "country": "GB"})

    assert (status, location) == (400, None)
    assert "Full name is required." in html and "Address line 1 is required." in html
    assert 'aria-invalid="true" aria-describedby="ship-name-error"' in html
    assert 'id="ship-name-error"' in html
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"
    assert sandbox.events() == []


def test_an_address_outside_the_allowed_countries_is_refused_and_what_was_typed_is_kept(client, sandbox):
    session = shipping_session(client)
    status, _, html = browser(sandbox, "POST", f"/pay/{session.id}", {**ADDRESS, "country": "US", "choice": "pay"})

    assert status == 400
    assert "We do not ship to US; choose one of GB, IE." in html
    assert 'value="Ada Lovelace"' in html and 'value="SW1Y 4JH"' in html
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"


def test_paying_with_an_address_keeps_it_on_the_session_as_stripe_renders_it(client, sandbox):
    session = shipping_session(client)
    status, location, _ = browser(sandbox, "POST", f"/pay/{session.id}", {**ADDRESS, "choice": "pay"})
    assert status == 303 and location.endswith(session.id)

    paid = raw(client.v1.checkout.sessions.retrieve(session.id))
    assert paid["payment_status"] == "paid"
    assert paid["collected_information"] == {
        "business_name": None,
        "individual_name": None,
        "shipping_details": {
            "address": {
                "city": "London",
                "country": "GB",
                "line1": "12 St James's Square",
                "line2": "Flat 3",
                "postal_code": "SW1Y 4JH",
                "state": None,
            },
            "name": "Ada Lovelace",
        },
    }
    assert paid["customer_details"]["name"] == "Ada Lovelace"
    assert_matches_fixture("checkout.session", paid)
    # The completed event carries it too: the shop reads it from there.
    [completed] = sandbox.events("checkout.session.completed")
    assert completed["event"]["data"]["object"]["collected_information"] == paid["collected_information"]


def test_a_scripted_outcome_ships_to_the_address_given_or_else_to_the_sandboxs_test_address(client, sandbox):
    given, default = shipping_session(client), shipping_session(client, countries=("IE",))
    sandbox.set_outcome(given.id, "paid", shipping_address={**ADDRESS, "country": "IE"})
    sandbox.set_outcome(default.id, "async_pending")

    assert (
        raw(client.v1.checkout.sessions.retrieve(given.id))["collected_information"]["shipping_details"]["address"][
            "country"
        ]
        == "IE"
    )
    shipped = raw(client.v1.checkout.sessions.retrieve(default.id))["collected_information"]["shipping_details"]
    assert shipped["name"] == "Sandbox Customer" and shipped["address"]["country"] == "IE"


def test_a_scripted_address_is_checked_like_the_form(client, sandbox):
    session, plain = shipping_session(client), new_session(client)
    with pytest.raises(SandboxControlError, match="We do not ship to US"):
        sandbox.set_outcome(session.id, "paid", shipping_address={**ADDRESS, "country": "US"})
    with pytest.raises(SandboxControlError, match="does not collect a shipping address"):
        sandbox.set_outcome(plain.id, "paid", shipping_address=ADDRESS)
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"
