"""GET /checkout/return (docs/REFERENCE.md, Storefront): the anonymous success URL asks the
provider only about the order's own current session, answers anything else with the same 404 as
an unknown reference after the same database read, and is throttled per client address."""

from __future__ import annotations

from flask import request
from sqlalchemy import event

from payment_helpers import Shopper
from shop.extensions import db

JSON = {"Accept": "application/json"}
HTML = {"Accept": "text/html"}
SESSION_READS = "/v1/checkout/sessions/"


def _session_reads(sandbox) -> int:
    return sandbox.request_count(method="GET", path_prefix=SESSION_READS)


def _statements(app, get):
    """The SQL statements the app ran while answering `get()`, and its answer."""
    seen: list[str] = []
    with app.app_context():
        engine = db.engine

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        answer = get()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen, answer


def test_a_wrong_session_id_is_the_unknown_references_404_without_asking_the_provider(
    fresh_paying_app, shopper, sandbox
):
    order = shopper.place()
    reference, sid = order["reference"], order["payment"]["session_id"]
    stranger = fresh_paying_app.test_client()
    shopper.client.get("/cart", headers=HTML)  # shows (and so clears) the flash the cart left
    before = _session_reads(sandbox)

    wrong = [
        f"/checkout/return?order={reference}&session_id=cs_test_guessed",
        f"/checkout/return?order={reference}&session_id={sid[:-1]}",  # one character off
        f"/checkout/return?order={reference}&session_id={sid}x",
        f"/checkout/return?order={reference}&session_id=",
        f"/checkout/return?order={reference}",
    ]
    unknown = f"/checkout/return?order=BK-NOSUCH00&session_id={sid}"
    for headers in (JSON, HTML):
        for client in (stranger, shopper.client):  # the browser that placed it too
            expected = client.get(unknown, headers=headers)
            assert expected.status_code == 404 and "We cannot show this order" in expected.get_data(as_text=True)
            for url in wrong:
                r = client.get(url, headers=headers)
                assert r.status_code == 404, url
                assert r.get_data(as_text=True) == expected.get_data(as_text=True), url
                assert "Location" not in r.headers
    assert _session_reads(sandbox) == before  # not one provider call
    assert shopper.order(reference)["status"] == "PaymentInitiated"


def test_a_wrong_session_id_and_an_unknown_reference_take_the_same_database_read(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    reference = order["reference"]
    client = fresh_paying_app.test_client()
    client.get("/checkout/return?order=BK-NOSUCH00&session_id=cs_test_x", headers=JSON)  # warm up the session
    unknown, a = _statements(
        fresh_paying_app, lambda: client.get("/checkout/return?order=BK-NOSUCH00&session_id=cs_test_x", headers=JSON)
    )
    wrong, b = _statements(
        fresh_paying_app, lambda: client.get(f"/checkout/return?order={reference}&session_id=cs_test_x", headers=JSON)
    )
    assert a.status_code == b.status_code == 404 and a.get_json() == b.get_json()
    assert unknown == wrong and len(wrong) >= 1


def test_the_orders_own_session_still_confirms_the_payment_with_one_provider_call(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    reference, sid = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(sid, "paid")
    assert shopper.order(reference)["status"] == "PaymentInitiated"  # no webhook reached this app
    before = _session_reads(sandbox)

    back = shopper.come_back(reference, sid)
    assert back.status_code == 303 and back.headers["Location"].endswith(f"/orders/{reference}")
    assert _session_reads(sandbox) == before + 1
    assert shopper.order(reference)["status"] == "Paid"

    phone = fresh_paying_app.test_client()  # the customer's second device: sent on with the token
    there = phone.get(f"/checkout/return?order={reference}&session_id={sid}")
    assert there.status_code == 303 and "token=" in there.headers["Location"]


def test_an_order_the_webhook_already_made_paid_returns_without_asking_the_provider(fresh_paying_app, shopper, sandbox):
    order = shopper.place()
    reference, sid = order["reference"], order["payment"]["session_id"]
    sandbox.set_outcome(sid, "paid")
    assert shopper.come_back(reference, sid).status_code == 303
    assert shopper.order(reference)["status"] == "Paid"
    before = _session_reads(sandbox)

    for client in (shopper.client, fresh_paying_app.test_client()):  # its browser, and a second device
        back = client.get(f"/checkout/return?order={reference}&session_id={sid}")
        assert back.status_code == 303 and f"/orders/{reference}" in back.headers["Location"]
    page = shopper.client.get(back.headers["Location"].split("localhost", 1)[-1], headers=HTML).get_data(as_text=True)

    assert _session_reads(sandbox) == before  # what the provider would say is already applied
    assert "could not confirm" not in page


def test_past_the_limit_the_return_page_is_a_429_in_words_with_retry_after_and_no_provider_call(make_shop, sandbox):
    app = make_shop(sandbox=True, CHECKOUT_RETURN_PER_MINUTE=3)
    shopper = Shopper(app, app.skus)
    order = shopper.place()
    reference, sid = order["reference"], order["payment"]["session_id"]
    attacker = app.test_client()
    for _ in range(3):
        assert attacker.get(f"/checkout/return?order={reference}&session_id=cs_test_x").status_code == 404
    before = _session_reads(sandbox)

    r = attacker.get(f"/checkout/return?order={reference}&session_id={sid}", headers=JSON)
    assert r.status_code == 429
    body = r.get_json()
    assert "Too many requests" in body["error"] and body["status"] == 429
    assert 1 <= int(r.headers["Retry-After"]) <= 61 and body["retry_after_seconds"] == int(r.headers["Retry-After"])
    page = attacker.get(f"/checkout/return?order={reference}&session_id={sid}", headers=HTML)
    assert page.status_code == 429 and "Too many requests" in page.get_data(as_text=True)
    assert "Retry-After" in page.headers
    assert _session_reads(sandbox) == before  # refused before the provider was asked
    # Per address: another client address still gets through.
    other = app.test_client().get(
        f"/checkout/return?order={reference}&session_id={sid}", environ_base={"REMOTE_ADDR": "10.0.0.9"}
    )
    assert other.status_code == 303
    # Other storefront pages are not counted.
    assert attacker.get(f"/orders/{reference}", headers=JSON).status_code == 404


def test_the_throttles_check_their_own_pages_and_no_other(make_shop, monkeypatch):
    """The return page's, the order links form's and the console login's limiters look at their own
    endpoint's requests only: a catalog, cart or orders request runs none of their checks."""
    import flask_limiter

    checked: list[str | None] = []
    check = flask_limiter.Limiter._check_request_limit

    def counting(self, *args, **kwargs):
        checked.append(request.endpoint)
        return check(self, *args, **kwargs)

    monkeypatch.setattr(flask_limiter.Limiter, "_check_request_limit", counting)
    app = make_shop(CHECKOUT_RETURN_PER_MINUTE=3)
    client = app.test_client()
    for path in ("/", "/cart", "/orders"):
        assert client.get(path, headers=JSON).status_code == 200
    assert checked == []

    for _ in range(4):
        last = client.get("/checkout/return?order=BK-NONE&session_id=cs_test_x", headers=JSON)
    assert last.status_code == 429  # the return page's own limit still counts
    assert set(checked) == {"storefront.checkout_return"}
