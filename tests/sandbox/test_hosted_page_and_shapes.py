"""The hosted payment page, and the JSON shapes checked against Stripe's example objects."""

import http.client
import json
import time
from urllib.parse import urlencode, urlsplit

from lane_priority import serving
from shop.stripe_sandbox.testing import WebhookReceiver, wait_until


def new_session(client, **overrides):
    params = {
        "mode": "payment",
        "success_url": "http://shop.test/checkout/return?order=ORD-9&session_id={CHECKOUT_SESSION_ID}",
        "cancel_url": "http://shop.test/orders/ORD-9",
        "client_reference_id": "ORD-9",
        "line_items": [
            {
                "price_data": {"currency": "usd", "unit_amount": 1250, "product_data": {"name": "Blue <Mug>"}},
                "quantity": 2,
            }
        ],
    }
    params.update(overrides)
    return client.v1.checkout.sessions.create(params=params)


def browser(sandbox, method, path, form=None):
    """One request as a browser makes it, without following redirects."""
    parts = urlsplit(sandbox.base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    body = urlencode(form).encode() if form is not None else None
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if form is not None else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    result = response.status, response.getheader("Location"), response.read().decode()
    conn.close()
    return result


# -- hosted page ---------------------------------------------------------------------


def test_the_page_shows_lines_total_and_the_four_choices(client, sandbox):
    session = new_session(client)
    status, _, html = browser(sandbox, "GET", urlsplit(session.url).path)

    assert status == 200
    assert "Blue &lt;Mug&gt; × 2" in html  # escaped
    assert "$25.00" in html
    for label in ("Pay", "Decline", "Pay later (async: succeeds)", "Pay later (async: fails)"):
        assert f">{label}" in html


def test_pay_redirects_to_the_success_url_with_the_session_id(client, sandbox):
    session = new_session(client)
    status, location, _ = browser(sandbox, "POST", f"/pay/{session.id}", {"choice": "pay"})

    assert status == 303
    assert location == f"http://shop.test/checkout/return?order=ORD-9&session_id={session.id}"
    assert client.v1.checkout.sessions.retrieve(session.id).payment_status == "paid"
    status, _, html = browser(sandbox, "GET", f"/pay/{session.id}")
    assert "This order is paid" in html and 'value="pay"' not in html


def test_decline_rerenders_with_the_card_error_and_stays_payable(client, sandbox):
    session = new_session(client)
    status, location, html = browser(sandbox, "POST", f"/pay/{session.id}", {"choice": "decline"})

    assert location is None and status == 402
    assert "Your card was declined" in html and 'value="pay"' in html
    assert client.v1.checkout.sessions.retrieve(session.id).status == "open"
    # As at Stripe: the failed attempt's payment_intent.payment_failed, no checkout.session event.
    assert [e["type"] for e in sandbox.events()] == ["payment_intent.payment_failed"]


def test_pay_later_succeeds_by_itself_a_couple_of_seconds_later(client, sandbox):
    with serving(WebhookReceiver) as receiver:
        client.v1.webhook_endpoints.create(params={"url": receiver.url, "enabled_events": ["*"]})
        session = new_session(client)
        status, location, _ = browser(sandbox, "POST", f"/pay/{session.id}", {"choice": "async_succeeds"})
        assert status == 303 and session.id in location
        assert client.v1.checkout.sessions.retrieve(session.id).payment_status == "unpaid"

        deliveries = receiver.wait_for(2, timeout=5)
        assert [d.json()["type"] for d in deliveries] == [
            "checkout.session.completed",
            "checkout.session.async_payment_succeeded",
        ]
        assert client.v1.checkout.sessions.retrieve(session.id).payment_status == "paid"


def test_an_expired_session_shows_a_message_instead_of_buttons(client, sandbox):
    session = new_session(client)
    client.v1.checkout.sessions.expire(session.id)

    status, _, html = browser(sandbox, "GET", f"/pay/{session.id}")
    assert status == 200 and "has expired" in html and 'value="pay"' not in html
    status, location, html = browser(sandbox, "POST", f"/pay/{session.id}", {"choice": "pay"})
    assert status == 409 and location is None
    assert client.v1.checkout.sessions.retrieve(session.id).payment_status == "unpaid"


def test_an_unknown_session_page_is_404(sandbox):
    assert browser(sandbox, "GET", "/pay/cs_test_nope")[0] == 404


# -- shapes --------------------------------------------------------------------------

# The JSON type of every top-level field in Stripe's example objects
# (shared/stripe-fixtures/fixtures3-subset.json); "null" means the example leaves it null,
# so any type is accepted there.
FIXTURE_FIELDS = {
    "checkout.session": {
        "array": "custom_fields payment_method_types shipping_options",
        "boolean": "livemode",
        "integer": "created expires_at",
        "null": "allow_promotion_codes amount_subtotal amount_total billing_address_collection "
        "client_reference_id client_secret currency customer customer_account customer_creation "
        "customer_email discounts integration_identifier invoice locale origin_context "
        "payment_link payment_method_collection recovered_from setup_intent submit_type "
        "subscription ui_mode",
        "object": "adaptive_pricing after_expiration automatic_tax collected_information consent "
        "consent_collection currency_conversion custom_text customer_details invoice_creation "
        "managed_payments metadata payment_method_configuration_details payment_method_options "
        "permissions phone_number_collection saved_payment_method_options "
        "shipping_address_collection shipping_cost total_details wallet_options",
        "string": "cancel_url id mode object payment_intent payment_status status success_url url",
    },
    "event": {
        "boolean": "livemode",
        "integer": "created pending_webhooks",
        "null": "api_version",
        "object": "data request",
        "string": "id object type",
    },
    "payment_intent": {
        "array": "payment_method_types",
        "boolean": "livemode",
        "integer": "amount amount_capturable amount_received canceled_at created",
        "null": "application application_fee_amount cancellation_reason customer customer_account "
        "description excluded_payment_method_types latest_charge on_behalf_of payment_method "
        "receipt_email review setup_future_usage source statement_descriptor "
        "statement_descriptor_suffix transfer_group",
        "object": "amount_details automatic_payment_methods last_payment_error managed_payments "
        "metadata next_action payment_method_configuration_details payment_method_options "
        "processing shipping transfer_data",
        "string": "capture_method client_secret confirmation_method currency id object status",
    },
    "refund": {
        "integer": "amount created",
        "null": "balance_transaction customer customer_account payment_intent payment_method reason "
        "receipt_number source_transfer_reversal transfer_reversal",
        "object": "destination_details metadata",
        "string": "charge currency id object status",
    },
    "webhook_endpoint": {
        "array": "enabled_events",
        "boolean": "livemode",
        "integer": "created",
        "null": "api_version application",
        "object": "metadata",
        "string": "description id object status url",
    },
}
JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}


def assert_matches_fixture(resource, body, *, extra=()):
    expected = {name: kind for kind, names in FIXTURE_FIELDS[resource].items() for name in names.split()}
    for name, value in body.items():
        if name in extra:
            continue
        assert name in expected, f"{resource}.{name} is not in Stripe's example object"
        if value is not None and expected[name] != "null":
            assert JSON_TYPES[type(value)] == expected[name], f"{resource}.{name}"


def raw(obj):
    return json.loads(obj.last_response.body)


def test_every_object_uses_stripe_field_names_and_types(client, sandbox):
    with serving(WebhookReceiver) as receiver:
        created = client.v1.webhook_endpoints.create(params={"url": receiver.url, "enabled_events": ["*"]})
        assert_matches_fixture("webhook_endpoint", raw(created), extra=("secret",))
        assert_matches_fixture("webhook_endpoint", raw(client.v1.webhook_endpoints.retrieve(created.id)))

        session = new_session(client, metadata={"order_id": "9"}, customer_email="a@b.co")
        assert_matches_fixture("checkout.session", raw(session))
        sandbox.set_outcome(session.id, "paid")
        paid = client.v1.checkout.sessions.retrieve(session.id)
        assert_matches_fixture("checkout.session", raw(paid))
        assert_matches_fixture("payment_intent", raw(client.v1.payment_intents.retrieve(paid.payment_intent)))
        refund = client.v1.refunds.create(params={"payment_intent": paid.payment_intent, "amount": 100})
        assert_matches_fixture("refund", raw(refund))
        event = client.v1.events.list().data[0]
        assert_matches_fixture("event", raw(client.v1.events.retrieve(event.id)))
        assert_matches_fixture("checkout.session", raw(client.v1.events.retrieve(event.id))["data"]["object"])

        [delivery] = receiver.wait_for(1)
        assert_matches_fixture("event", delivery.json())
        declined = new_session(client)
        pi = sandbox.set_outcome(declined.id, "declined")["payment_intent"]
        client.v1.checkout.sessions.expire(declined.id)
        canceled = raw(client.v1.payment_intents.retrieve(pi))
        assert canceled["status"] == "canceled"
        assert_matches_fixture("payment_intent", canceled)


def test_lists_have_stripe_list_shape(client, sandbox):
    new_session(client)
    body = raw(client.v1.checkout.sessions.list())
    assert set(body) == {"object", "data", "has_more", "url"}
    assert (body["object"], body["url"], body["has_more"]) == ("list", "/v1/checkout/sessions", False)


def test_session_self_expiry_also_happens_without_any_request(client, sandbox):
    """The background ticker expires sessions even when nobody asks about them."""
    session = new_session(client, expires_at=int(time.time()) + 61)
    with sandbox.sandbox.lock:  # move the clock without the control route's own tick
        sandbox.sandbox.clock_offset += 62

    def expired_event():
        with sandbox.sandbox.lock:
            return [e for e in sandbox.sandbox.events.values() if e.type == "checkout.session.expired"]

    [event] = wait_until(expired_event, timeout=2)
    assert event.session_id == session.id
