"""A paid order says how much of its payment went back (docs/REFERENCE.md, `GET /orders/<ref>`,
`refunded`): "Partially refunded" or "Refunded" with the refunded and net amounts on the
customer's page and JSON, the console's order and list, and the orders file; a refunded order
no longer promises to pack anything, and the console offers no refund with nothing left."""

from __future__ import annotations

import csv
import io

import pytest

from payment_helpers import paid_with_operator, run_everything

JSON = {"Accept": "application/json"}


@pytest.fixture
def shop(monkeypatch, tmp_path, make_fresh_app, sandbox):
    """A paid order of 2 x SOCK-M and a logged-in console: (app, console client, token, reference,
    the order's access token, its total)."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    paid = paid_with_operator(make_fresh_app, sandbox, "SOCK-M", 2)
    return paid.app, paid.client, paid.token, paid.reference, paid.access_token, paid.total


def _refund(app, client, token, reference, amount: int | None):
    data = {"csrf_token": token, "reason": "customer asked", "restock": "no"}
    if amount is not None:
        data["amount"] = str(amount)
    assert client.post(f"/console/orders/{reference}/refund", data=data, headers=JSON).status_code == 200
    run_everything(app)  # the provider's answer: succeeded


def _customer(app, reference, access):
    customer = app.test_client()
    page = customer.get(f"/orders/{reference}", query_string={"token": access}).get_data(as_text=True)
    data = customer.get(f"/orders/{reference}", query_string={"token": access}, headers=JSON).get_json()
    return page, data


def _csv_row(client, reference) -> dict:
    rows = list(csv.DictReader(io.StringIO(client.get("/console/orders?format=csv").get_data(as_text=True))))
    [row] = [r for r in rows if r["reference"] == reference]
    return row


def test_a_partly_refunded_order_reads_partially_refunded_with_what_went_back_and_the_net(shop):
    app, client, token, ref, access, total = shop
    page, data = _customer(app, ref, access)
    assert data["refunded"] == 0 and "Partially refunded" not in page and "We pack your items" in page
    _refund(app, client, token, ref, 500)
    page, data = _customer(app, ref, access)
    assert data["refunded"] == 500
    assert "Partially refunded</span>" in page and "$5.00 went back to your payment" in page
    net = f"${(total - 500) / 100:,.2f}"
    assert f"you paid {net} in all" in page and "We pack your items" in page
    console = client.get(f"/console/orders/{ref}").get_data(as_text=True)
    assert f"<strong>Partially refunded</strong>: $5.00 refunded of ${total / 100:,.2f}, {net} net" in console
    assert "Refund…" in console
    listed = client.get("/console/orders").get_data(as_text=True)
    assert '<span class="badge partially-refunded">Partially refunded</span>' in listed
    assert f"$5.00 refunded, {net} net" in listed
    [row] = [o for o in client.get("/console/orders", headers=JSON).get_json()["orders"] if o["reference"] == ref]
    assert (row["refunded"], row["net"], row["money_back"]) == (500, total - 500, "partially_refunded")
    assert (_csv_row(client, ref)["payment"], _csv_row(client, ref)["refunded"]) == ("partially_refunded", "5.00")


def test_a_fully_refunded_order_reads_refunded_packs_nothing_and_offers_no_refund(shop):
    app, client, token, ref, access, total = shop
    _refund(app, client, token, ref, None)  # all that is left
    page, data = _customer(app, ref, access)
    assert data["refunded"] == total and data["status"] == "Paid"
    assert '<span class="badge paid-refunded">Refunded</span>' in page
    assert "went back to your payment" in page and "We pack your items" not in page
    console = client.get(f"/console/orders/{ref}").get_data(as_text=True)
    assert "<strong>Refunded</strong>" in console and "$0.00 net" in console
    assert "Nothing left to refund" in console and "Refund…" not in console
    assert _csv_row(client, ref)["payment"] == "refunded"
