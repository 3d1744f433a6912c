"""The console's lists find what an operator half remembers: part of a reference or an email in any
case, an amount as the page shows it (exact, or a range), the days something happened, its state,
all together; and a filter that cannot be read is said in words on the page, never a 500
(docs/REFERENCE.md, Console, "Searching a list")."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import event, select

from compensation_support import cancel_in
from factories import force_order, place_order_for, seed_catalog_rows
from shop.console import queries
from shop.extensions import db
from shop.models import Order, OutboxDelivery, Refund, WebhookReceipt

JSON = {"Accept": "application/json"}


def at(day: str, hour: int = 12) -> datetime:
    return datetime.fromisoformat(day).replace(hour=hour, tzinfo=UTC)


@pytest.fixture
def orders(fresh_app, token):
    """Five orders with known emails, totals, currencies and days placed: {name: reference}."""
    wanted = {
        "ann": dict(email="Ann.Lee@Example.com", total=1800, currency="usd", created_at=at("2026-11-28")),
        "bob": dict(email="bob@shop.example", total=2500, currency="usd", created_at=at("2026-11-29", 23)),
        "cy": dict(email="cy@example.org", total=999, currency="usd", created_at=at("2026-11-30", 0)),
        "dee": dict(email="dee@example.com", total=1500, currency="jpy", created_at=at("2026-12-01")),
        "eve": dict(email="eve@example.com", total=1800, currency="usd", created_at=at("2026-12-02")),
    }
    refs = {}
    with fresh_app.app_context():
        seed_catalog_rows()
        for name, values in wanted.items():
            placed = place_order_for()
            force_order(placed.reference, **values)
            refs[name] = placed.reference
        db.session.commit()
    return refs


def found(client, **query) -> list[str]:
    r = client.get("/console/orders", query_string=query, headers=JSON)
    assert r.status_code == 200, r.get_json()
    return sorted(o["reference"] for o in r.get_json()["orders"])


def names(refs, *wanted) -> list[str]:
    return sorted(refs[n] for n in wanted)


def test_an_order_is_found_by_part_of_its_reference_in_any_case(fresh_client, orders):
    ref = orders["bob"]
    assert found(fresh_client, q=ref[3:9].lower()) == [ref]
    assert found(fresh_client, q=ref.lower()) == [ref]
    # Every reference starts "BK-": a part they all share finds them all.
    assert found(fresh_client, q="bk-") == sorted(orders.values())


def test_an_order_is_found_by_part_of_its_email_in_any_case(fresh_client, orders):
    assert found(fresh_client, q="ANN.LEE") == names(orders, "ann")
    assert found(fresh_client, q="example.com") == names(orders, "ann", "dee", "eve")
    assert found(fresh_client, q="@SHOP.") == names(orders, "bob")
    # LIKE's wildcards typed by the operator are matched as themselves, not as wildcards.
    assert found(fresh_client, q="%") == []
    assert found(fresh_client, q="a_n") == []


def test_a_whole_reference_or_email_is_looked_up_along_its_index_not_searched_for(fresh_app, fresh_client, orders):
    statements: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        if "FROM orders" in statement:
            statements.append(statement)

    with fresh_app.app_context():
        engine = db.engine
    event.listen(engine, "before_cursor_execute", note)
    try:
        assert found(fresh_client, q="  ann.lee@EXAMPLE.com ") == names(orders, "ann")
        assert found(fresh_client, q="lee@example.com") == []  # a whole address: that address only
        assert found(fresh_client, q=orders["cy"].lower()) == names(orders, "cy")
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert statements and not [s for s in statements if " LIKE " in s.upper()]
    assert found(fresh_client, q="lee@example") == names(orders, "ann")  # not a whole address: a part


def test_an_exact_amount_is_read_in_the_currencys_own_units(fresh_client, orders):
    assert found(fresh_client, amount="18.00") == names(orders, "ann", "eve")
    assert found(fresh_client, amount="$18") == names(orders, "ann", "eve")
    assert found(fresh_client, amount="1,500") == names(orders, "dee")  # a thousands comma, as pages write it
    # Yen have no minor unit: 1500 is ¥1,500 (stored 1500), not 150,000 of something.
    assert found(fresh_client, amount="1500") == names(orders, "dee")
    assert found(fresh_client, amount="15.00") == []  # $15.00 is 1500 cents; no dollar order has it
    # A bound finer than the currency has matches nothing rather than a rounded neighbour.
    assert found(fresh_client, amount="18.004") == []


def test_a_three_decimal_currency_reads_its_amounts_to_the_fils(fresh_app, fresh_client, orders):
    with fresh_app.app_context():
        force_order(orders["cy"], total=1500, currency="kwd")  # 1.500 dinar
        db.session.commit()
    assert found(fresh_client, amount="1.5") == names(orders, "cy")
    assert found(fresh_client, amount="1500") == names(orders, "dee")  # yen, not 1,500 dinar
    assert found(fresh_client, amount_min="1.499", amount_max="1.501") == names(orders, "cy")


def test_an_amount_range_includes_both_ends(fresh_client, orders):
    assert found(fresh_client, amount_min="9.99", amount_max="18") == names(orders, "ann", "cy", "eve")
    assert found(fresh_client, amount_min="18.01") == names(orders, "bob", "dee")
    assert found(fresh_client, amount_max="9.99") == names(orders, "cy")


def test_a_date_range_takes_in_the_whole_of_its_last_day(fresh_client, orders):
    assert found(fresh_client, **{"from": "2026-11-29", "to": "2026-11-30"}) == names(orders, "bob", "cy")
    assert found(fresh_client, **{"from": "2026-12-01"}) == names(orders, "dee", "eve")
    assert found(fresh_client, to="2026-11-28") == names(orders, "ann")
    # A time narrows it to the minute (UTC, as the console shows times).
    assert found(fresh_client, **{"from": "2026-11-29 23:00", "to": "2026-11-30 00:00"}) == names(orders, "bob", "cy")
    assert found(fresh_client, **{"from": "2026-11-29 23:01"}) == names(orders, "cy", "dee", "eve")


def test_filters_combine_with_the_order_state(fresh_app, fresh_client, orders):
    with fresh_app.app_context():
        force_order(orders["eve"], status="Cancelled")
        db.session.commit()
    assert found(fresh_client, status="PendingPayment", amount="18.00") == names(orders, "ann")
    assert found(fresh_client, status="Cancelled", q="EXAMPLE") == names(orders, "eve")
    assert found(fresh_client, status="PendingPayment", q="example.com", amount_min="10", **{"from": "2026-11-29"}) == (
        names(orders, "dee")
    )
    r = fresh_client.get("/console/orders?q=ann&amount_min=1&from=2026-11-01&to=2026-11-30", headers=JSON)
    assert r.get_json()["filters"] == {
        "stuck": False,
        "status": [],
        "q": "ann",
        "from": "2026-11-01",
        "to": "2026-11-30",
        "amount": "",
        "amount_min": "1",
        "amount_max": "",
    }


@pytest.mark.parametrize(
    "query, words",
    [
        ({"from": "2026-13-01"}, "The start date “2026-13-01” is not a date"),
        ({"to": "last tuesday"}, "The end date “last tuesday” is not a date"),
        ({"from": "2026-12-02", "to": "2026-12-01"}, "ends (2026-12-01) before it starts (2026-12-02)"),
        ({"amount_min": "-5"}, "Lowest amount “-5” is negative"),
        ({"amount_max": "lots"}, "Highest amount “lots” is not an amount"),
        ({"amount": "1e400"}, "Amount “1e400” is not an amount"),
        ({"amount": "18,50"}, "Amount “18,50” is not an amount. Write it with a point before the cents"),
        ({"amount": "99999999999999999999"}, "larger than any order could be"),
        ({"amount_min": "30", "amount_max": "20"}, "The lowest amount (30) is above the highest (20)"),
    ],
)
def test_a_filter_that_cannot_be_read_is_said_in_words_on_the_page(fresh_client, orders, query, words):
    page = fresh_client.get("/console/orders", query_string=query)
    assert page.status_code == 400
    html = page.get_data(as_text=True)
    assert words in html.replace("&#34;", '"')
    assert 'id="filter-errors" role="alert"' in html
    assert html.count(words) == 1  # beside the form, not also in a banner
    assert "BK-" not in re.sub(r'value="[^"]*"', "", html)  # no rows were looked for
    answer = fresh_client.get("/console/orders", query_string=query, headers=JSON)
    assert answer.status_code == 400
    body = answer.get_json()
    assert words in body["error"] and body["orders"] == [] and body["errors"]


def test_the_pager_keeps_the_filters(fresh_client, orders, monkeypatch):
    monkeypatch.setattr(queries, "PER_PAGE", 2)
    query = {"q": "example.com", "amount_min": "5", "from": "2026-11-01"}
    first = fresh_client.get("/console/orders", query_string=query).get_data(as_text=True)
    next_link = re.search(r'href="([^"]*page=2[^"]*)">next page', first).group(1).replace("&amp;", "&")
    for kept in ("q=example.com", "amount_min=5", "from=2026-11-01"):
        assert kept in next_link
    second = fresh_client.get(next_link, headers=JSON).get_json()
    assert second["page"] == 2 and second["filters"]["q"] == "example.com"
    first_page = fresh_client.get("/console/orders", query_string=query, headers=JSON).get_json()["orders"]
    both = [o["reference"] for o in first_page + second["orders"]]
    assert len(first_page) == 2 and sorted(both) == names(orders, "ann", "dee", "eve")


def test_the_refunds_webhooks_and_outbox_lists_take_the_same_filters(fresh_app, fresh_client, orders):
    with fresh_app.app_context():
        ann_id = db.session.execute(select(Order.id).where(Order.reference == orders["ann"])).scalar_one()
    restore = cancel_in(fresh_app, ann_id)  # writes the order's restore_inventory delivery
    with fresh_app.app_context():
        order = db.session.execute(select(Order).where(Order.reference == orders["ann"])).scalar_one()
        other = db.session.execute(select(Order).where(Order.reference == orders["bob"])).scalar_one()
        for o, amount, day in ((order, 1800, "2026-11-28"), (other, 500, "2026-12-01")):
            db.session.add(
                Refund(
                    order_id=o.id,
                    session_id="cs_x",
                    amount=amount,
                    currency="usd",
                    reason="late money",
                    status="failed",
                    created_at=at(day),
                )
            )
            db.session.add(
                WebhookReceipt(
                    event_id=f"evt_{o.id}",
                    event_type="checkout.session.completed",
                    outcome="accepted",
                    order_id=o.id,
                    http_status=200,
                    received_at=at(day),
                )
            )
        ann_deliveries = set(
            db.session.execute(select(OutboxDelivery.id).where(OutboxDelivery.order_id == order.id)).scalars()
        )
        db.session.commit()

    refunds = fresh_client.get("/console/refunds", query_string={"amount": "18.00"}, headers=JSON).get_json()
    assert [r["order_reference"] for r in refunds["refunds"]] == [orders["ann"]]
    refunds = fresh_client.get("/console/refunds", query_string={"q": orders["bob"][-4:]}, headers=JSON).get_json()
    assert [r["order_reference"] for r in refunds["refunds"]] == [orders["bob"]]

    hooks = fresh_client.get("/console/webhooks", query_string={"from": "2026-11-30"}, headers=JSON).get_json()
    assert [w["order_reference"] for w in hooks["webhooks"]] == [orders["bob"]]
    hooks = fresh_client.get("/console/webhooks", query_string={"q": "SESSION.COMPLETED"}, headers=JSON).get_json()
    assert len(hooks["webhooks"]) == 2

    outbox = fresh_client.get("/console/outbox", query_string={"q": orders["ann"].lower()}, headers=JSON).get_json()
    assert restore in ann_deliveries
    assert {d["id"] for d in outbox["deliveries"] if isinstance(d["id"], int)} == ann_deliveries
    outbox = fresh_client.get("/console/outbox", query_string={"q": "RESTORE_INV"}, headers=JSON).get_json()
    assert [d["id"] for d in outbox["deliveries"] if isinstance(d["id"], int)] == [restore]

    for url in ("/console/refunds?from=soon", "/console/webhooks?to=2026-02-30", "/console/outbox?from=x"):
        page = fresh_client.get(url)
        assert page.status_code == 400 and "is not a date" in page.get_data(as_text=True), url
