"""The console's refund form puts back the units asked, line by line (docs/REFERENCE.md,
*Refunding a paid order*): each line offered with 0 by default and at most what can still go
back, the confirmation and the answer name the units with the stock before and after, and an
order with nothing left to refund gets no form."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from factories import on_hand
from payment_helpers import place_and_pay, run_everything
from shop.extensions import db
from shop.models import Order, OrderLine
from support import log_in

JSON = {"Accept": "application/json"}
KEY = re.compile(r'name="request_key" value="([^"]+)"')


@pytest.fixture
def two_pairs(monkeypatch, tmp_path, make_fresh_app, sandbox):
    """A logged-in client and a paid order of 2 x SOCK-M: (app, client, token, reference, line id, sock)."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    app, oid, _total, skus = place_and_pay(make_fresh_app, sandbox, "SOCK-M", 2)
    run_everything(app)
    client = app.test_client()
    token = log_in(app, client)
    with app.app_context():
        reference = db.session.get(Order, oid).reference
        line = db.session.execute(select(OrderLine.id).where(OrderLine.order_id == oid)).scalar_one()
        db.session.remove()
    return app, client, token, reference, line, skus["SOCK-M"]


def test_the_form_offers_each_line_with_zero_to_put_back_and_at_most_what_was_bought(two_pairs):
    app, client, token, ref, line, sock = two_pairs
    page = client.get(f"/console/orders/{ref}/refund").get_data(as_text=True)
    assert re.search(rf'name="restock_{line}" type="number" inputmode="numeric" min="0" max="2" value="0"', page)
    [shown] = client.get(f"/console/orders/{ref}/refund", headers=JSON).get_json()["lines"]
    assert (shown["sku"], shown["quantity"], shown["restocked"], shown["left"], shown["restock"]) == (
        "SOCK-M",
        2,
        0,
        2,
        0,
    )
    three = client.get(
        f"/console/orders/{ref}/refund", query_string={"amount": "1", "reason": "x", f"restock_{line}": "3"}
    )
    assert three.status_code == 400
    assert "At most 2 × SOCK-M can go back: 2 bought, 0 back already." in three.get_data(as_text=True)


def test_one_pair_of_two_goes_back_and_the_answer_names_it_with_the_stock(two_pairs):
    app, client, token, ref, line, sock = two_pairs
    query = {"amount": "1.00", "reason": "one pair returned", f"restock_{line}": "1"}
    confirm = client.get(f"/console/orders/{ref}/refund", query_string=query).get_data(as_text=True)
    assert "Stock: put back: 1 × SOCK-M." in confirm
    assert f'<input type="hidden" name="restock_{line}" value="1">' in confirm
    before = on_hand(sock, app)
    data = {
        "csrf_token": token,
        "request_key": KEY.search(confirm).group(1),
        "amount": "100",
        "reason": "one pair returned",
        "restock": "no",
        f"restock_{line}": "1",
    }
    done = client.post(f"/console/orders/{ref}/refund", data=data, headers=JSON).get_json()
    assert on_hand(sock, app) == before + 1
    assert f"Put back in stock: 1 × SOCK-M (stock {before} → {before + 1})." in done["message"]
    assert done["restocked_lines"] == [
        {"sku": "SOCK-M", "quantity": 1, "on_hand_before": before, "on_hand_after": before + 1}
    ]
    again = client.post(f"/console/orders/{ref}/refund", data=data, headers=JSON).get_json()
    assert again["already"] is True and again["restocked_lines"] == done["restocked_lines"]
    assert on_hand(sock, app) == before + 1
    [shown] = client.get(f"/console/orders/{ref}/refund", headers=JSON).get_json()["lines"]
    assert (shown["restocked"], shown["left"]) == (1, 1)


def test_an_order_refunded_in_full_gets_no_form_but_nothing_left_to_refund(two_pairs):
    app, client, token, ref, line, sock = two_pairs
    data = {"csrf_token": token, "reason": "all of it", "restock": "no"}
    assert client.post(f"/console/orders/{ref}/refund", data=data, headers=JSON).status_code == 200
    page = client.get(f"/console/orders/{ref}/refund")
    body = page.get_data(as_text=True)
    assert page.status_code == 409 and "Nothing is left to refund" in body
    assert "Review the refund" not in body and 'name="amount"' not in body
