"""A provider that refuses to start a payment (a 4xx on session creation): the customer is told
in words, and the provider's reason is kept for an operator on the order's console timeline."""

from __future__ import annotations

import pytest

from factories import seed_catalog_rows
from payment_helpers import JSON, Shopper
from support import log_in


@pytest.fixture
def strict_provider(sandbox):
    """A provider whose sessions must live two hours: the shop's 30-minute window is refused."""
    inner = sandbox.sandbox
    saved = inner.min_session_seconds
    inner.min_session_seconds = 7200
    yield sandbox
    inner.min_session_seconds = saved


def test_a_refused_payment_start_tells_the_customer_in_words_and_the_operator_why(fresh_paying_app, strict_provider):
    shopper = Shopper(fresh_paying_app, seed_catalog_rows(fresh_paying_app))
    r = shopper.checkout(email="ann@example.com")
    assert r.status_code == 303
    reference = shopper.client.get("/orders", headers=JSON).get_json()["orders"][0]["reference"]
    assert r.headers["Location"].endswith(f"/orders/{reference}")

    page = shopper.client.get(f"/orders/{reference}", headers={"Accept": "text/html"}).get_data(as_text=True)
    assert "turned the request down" in page and "Nothing was charged" in page

    operator = fresh_paying_app.test_client()
    log_in(fresh_paying_app, operator)
    timeline = operator.get(f"/console/orders/{reference}", headers=JSON).get_json()
    refusals = [t for t in timeline["timeline"] if t["kind"] == "provider_refused"]
    assert len(refusals) == 1, timeline["timeline"]
    assert refusals[0]["what"] == "provider refused payment attempt 1"
    # The sandbox's own words for the refusal, as Stripe would give them.
    assert "expires_at" in refusals[0]["detail"] and "2 hours" in refusals[0]["detail"]
    assert timeline["provider_refusals"][0]["attempt"] == 1
