"""A console list as CSV (`?format=csv`): the rows the page's filters select, every page of them,
streamed as they are read in keyset pages (never the whole list in memory), with a header row,
and with every cell a spreadsheet would run as a formula written as text."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import event, select

from compensation_support import cancel_in
from factories import force_order, place_order_for, seed_catalog_rows
from shop.console import csv_stream
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order, Refund, RestoreWarning, WebhookReceipt
from support import OPERATOR_EMAIL

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
ORDER_HEADER = [
    "reference",
    "status",
    "total",
    "currency",
    "email",
    "payment_attempts",
    "created_at",
    "updated_at",
    "payment",
    "refunded",
]


def rows_of(response) -> list[list[str]]:
    return list(csv.reader(io.StringIO(response.get_data(as_text=True))))


@pytest.fixture
def eight_orders(fresh_app, token):
    with fresh_app.app_context():
        seed_catalog_rows()
        refs = [place_order_for().reference for _ in range(8)]
        db.session.commit()
    return refs


@pytest.fixture
def order_selects(fresh_app):
    """Every SELECT that reads the orders table, as it runs."""
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "FROM orders" in statement:
            seen.append(statement)

    with fresh_app.app_context():
        engine = db.engine
    event.listen(engine, "before_cursor_execute", note)
    yield seen
    event.remove(engine, "before_cursor_execute", note)


def test_the_orders_csv_is_streamed_and_read_in_keyset_pages(fresh_client, eight_orders, order_selects, monkeypatch):
    monkeypatch.setattr(csv_stream, "CHUNK", 3)
    response = fresh_client.get("/console/orders?format=csv")
    assert response.status_code == 200
    assert response.is_streamed
    assert response.content_type == "text/csv; charset=utf-8"
    assert response.headers["Content-Disposition"].startswith('attachment; filename="orders-')
    assert response.headers["Cache-Control"] == "no-store"
    # Nothing is read before the body is: the rows come as the download goes.
    assert [s for s in order_selects if "LIMIT" in s.upper()] == []

    rows = rows_of(response)
    pages = [s for s in order_selects if "LIMIT" in s.upper()]
    assert rows[0] == ORDER_HEADER
    assert [r[0] for r in rows[1:]] == list(reversed(eight_orders))  # newest first, each once
    assert len(pages) == 3  # 3 + 3 + 2 rows: three pages of CHUNK, never all at once
    # Keyset pages: each after the first starts below the last id sent, not at an OFFSET.
    assert ["orders.id <" in s for s in pages] == [False, True, True]


def test_the_orders_csv_holds_the_filtered_list_in_the_pages_money_units(fresh_app, fresh_client, eight_orders):
    with fresh_app.app_context():
        force_order(eight_orders[2], email="Pat@Example.org", total=1850, currency="usd")
        force_order(eight_orders[5], email="pat.jones@example.org", total=1500, currency="jpy")
        db.session.commit()
    rows = rows_of(fresh_client.get("/console/orders", query_string={"format": "csv", "q": "PAT"}))
    assert rows[0] == ORDER_HEADER
    assert [(r[0], r[2], r[3], r[4]) for r in rows[1:]] == [
        (eight_orders[5], "1500", "JPY", "pat.jones@example.org"),
        (eight_orders[2], "18.50", "USD", "Pat@Example.org"),
    ]
    only_yen = rows_of(fresh_client.get("/console/orders", query_string={"format": "csv", "amount": "1500"}))
    assert [r[0] for r in only_yen[1:]] == [eight_orders[5]]
    # A filter that cannot be read is refused in words, not a download of everything.
    bad = fresh_client.get("/console/orders", query_string={"format": "csv", "amount_min": "-1"})
    assert bad.status_code == 400 and "negative" in bad.get_data(as_text=True)


def test_a_cell_a_spreadsheet_would_run_is_written_as_text(fresh_app, fresh_client, eight_orders):
    hostile = {
        eight_orders[0]: '=HYPERLINK("http://evil.example","x")@example.com',
        eight_orders[1]: "+1-555@example.com",
        eight_orders[2]: "-2+3@example.com",
        eight_orders[3]: "@SUM(A1)@example.com",
        eight_orders[4]: "\t=1@example.com",
    }
    with fresh_app.app_context():
        for ref, email in hostile.items():
            force_order(ref, email=email)
        db.session.commit()
    emails = {r[0]: r[4] for r in rows_of(fresh_client.get("/console/orders?format=csv"))[1:]}
    for ref, email in hostile.items():
        assert emails[ref] == "'" + email
    assert emails[eight_orders[6]].startswith("ann.")  # an ordinary cell is left alone


def test_the_download_is_a_generator_the_server_passes_through(fresh_app):
    with fresh_app.test_request_context("/console/orders?format=csv"):
        response = csv_stream.csv_response("x", ["a"], iter([("=1",), ("b",)]), list, now=utcnow())
        assert response.direct_passthrough and response.is_streamed
        # Bytes, as a WSGI server takes a passed-through body (str would fail there, not here).
        assert b"".join(response.response) == b"a\r\n'=1\r\nb\r\n"


def test_a_download_is_on_the_audit_trail_with_its_filters(fresh_client, eight_orders):
    query = {"format": "csv", "q": "example", "status": "PendingPayment"}
    rows_of(fresh_client.get("/console/orders", query_string=query))
    actions = fresh_client.get("/console/audit", headers={"Accept": "application/json"}).get_json()["actions"]
    assert [(a["action"], a["status"], a["outcome"]) for a in actions] == [
        ("export_csv", 200, "downloaded the orders list as CSV")
    ]
    assert actions[0]["operator"] and "format=csv" in actions[0]["target"] and "q=example" in actions[0]["target"]


def test_safe_cell_prefixes_only_formula_starts():
    assert csv_stream.safe_cell("=1+1") == "'=1+1"
    assert csv_stream.safe_cell("\rcmd") == "'\rcmd"
    assert csv_stream.safe_cell("a=1") == "a=1"
    assert csv_stream.safe_cell(None) == ""
    assert csv_stream.safe_cell(42) == "42"


def test_refunds_webhooks_and_deliveries_download_with_their_filters(fresh_app, fresh_client, eight_orders):
    with fresh_app.app_context():
        order = db.session.execute(select(Order).where(Order.reference == eight_orders[0])).scalar_one()
        db.session.add(
            Refund(order_id=order.id, session_id="cs_x", amount=1800, currency="usd", reason="=late", status="failed")
        )
        db.session.add(
            WebhookReceipt(
                event_id="evt_1", event_type="charge.refunded", outcome="rejected", reason="bad", http_status=400
            )
        )
        db.session.add(
            WebhookReceipt(
                event_id="evt_2",
                event_type="checkout.session.completed",
                outcome="accepted",
                order_id=order.id,
                http_status=200,
            )
        )
        order_id = order.id
        db.session.commit()
    restore = cancel_in(fresh_app, order_id)

    refunds = rows_of(fresh_client.get("/console/refunds?status=failed&format=csv"))
    assert refunds[0][:5] == ["id", "order_reference", "amount", "currency", "status"]
    assert [(r[1], r[2], r[4], r[5]) for r in refunds[1:]] == [(eight_orders[0], "18.00", "failed", "'=late")]

    hooks = rows_of(fresh_client.get("/console/webhooks?outcome=rejected&format=csv"))
    assert hooks[0] == [
        "id",
        "received_at",
        "event_id",
        "event_type",
        "outcome",
        "reason",
        "http_status",
        "order_reference",
    ]
    assert [(r[2], r[4]) for r in hooks[1:]] == [("evt_1", "rejected")]

    deliveries = rows_of(fresh_client.get("/console/outbox", query_string={"format": "csv", "q": "restore_inventory"}))
    assert deliveries[0] == [
        "id",
        "event",
        "handler",
        "status",
        "attempts",
        "last_error",
        "order_reference",
        "created_at",
    ]
    assert [(int(r[0]), r[2], r[6]) for r in deliveries[1:]] == [(restore, "restore_inventory", eight_orders[0])]


def test_the_list_page_offers_the_download_of_what_it_shows(fresh_client, eight_orders):
    html = fresh_client.get("/console/orders?q=ann&page=1&status=PendingPayment").get_data(as_text=True)
    link = html.split("Download CSV")[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert "format=csv" in link and "q=ann" in link and "status=PendingPayment" in link and "page=" not in link


def test_the_outbox_downloads_its_scheduled_commands_with_the_same_filters(fresh_app, fresh_client, eight_orders):
    commands = rows_of(
        fresh_client.get("/console/outbox", query_string={"format": "csv", "kind": "commands", "q": eight_orders[2]})
    )
    assert commands[0] == ["id", "kind", "status", "attempts", "last_error", "order_reference", "due_at", "created_at"]
    assert commands[1:], "each placed order has its payment deadline"
    assert {(r[1], r[5]) for r in commands[1:]} >= {("expire_unpaid_order", eight_orders[2])}
    assert all(r[0].startswith("cmd-") and r[5] == eight_orders[2] for r in commands[1:])
    # A kind is found by part of its name, like a handler's.
    by_kind = rows_of(fresh_client.get("/console/outbox?format=csv&kind=commands&q=expire_unpaid"))
    assert {r[5] for r in by_kind[1:]} == set(eight_orders)
    # The page offers both downloads, each keeping the filter typed.
    html = fresh_client.get("/console/outbox?q=expire").get_data(as_text=True)
    link = html.split("Download commands as CSV")[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert "format=csv" in link and "kind=commands" in link and "q=expire" in link


def test_the_audit_and_restore_warning_downloads_hold_their_columns_and_times(fresh_app, fresh_client, eight_orders):
    placed_at = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    with fresh_app.app_context():
        order = db.session.execute(select(Order).where(Order.reference == eight_orders[1])).scalar_one()
        db.session.add(
            RestoreWarning(order_id=order.id, variant_id=7, quantity=2, reason="=overflow", created_at=placed_at)
        )
        db.session.commit()
    fresh_client.get("/console/orders?format=csv").get_data()  # a download: on the audit trail

    warnings = rows_of(fresh_client.get("/console/restore-warnings?format=csv"))
    assert warnings == [
        [
            "id",
            "order_reference",
            "variant_id",
            "quantity",
            "reason",
            "state",
            "resolution",
            "created_at",
            "resolved_at",
        ],
        [warnings[1][0], eight_orders[1], "7", "2", "'=overflow", "open", "", "2026-03-04T05:06:07Z", ""],
    ]
    audit = rows_of(fresh_client.get("/console/audit?format=csv"))
    assert audit[0] == ["id", "at", "operator", "action", "target", "order_reference", "reason", "status", "outcome"]
    download = [r for r in audit[1:] if r[4] == "/console/orders?format=csv"]
    assert [r[2:] for r in download] == [
        [OPERATOR_EMAIL, "export_csv", "/console/orders?format=csv", "", "", "200", "downloaded the orders list as CSV"]
    ]
    assert ISO.fullmatch(download[0][1]), download[0][1]
