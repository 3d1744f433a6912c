"""One money summary (web.serialize.MoneyView) for an order's money wherever it is said: the
customer's page, the order's JSON (`refunded`, `charged`, `refunds_settled`) and the console's
money summary (Paid, Refunded, Net) agree, for a paid order partly refunded through the provider
and after a further refund that failed there and was settled outside it."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from payment_helpers import paid_with_operator, run_everything
from shop.domain.deadlines import utcnow
from shop.domain.refunds import RefundStatus
from shop.extensions import db
from shop.models import Refund
from shop.money import format_money
from shop.scheduling.sweep import run_cycle

JSON = {"Accept": "application/json"}


def _console_summary(client, reference) -> dict[str, str]:
    """The console's money summary as its page shows it: {"Paid": "$12.00", ...}."""
    page = client.get(f"/console/orders/{reference}").get_data(as_text=True)
    summary = page.split('id="money-summary"', 1)[1].split("</dl>", 1)[0]
    cells = [part.split("</dt><dd>", 1) for part in summary.split("<dt>")[1:]]
    bare = {label: value.split("</dd>", 1)[0] for label, value in cells}
    return {label: value.replace("<strong>", "").replace("</strong>", "") for label, value in bare.items()}


def _customer(app, reference, access) -> tuple[str, dict]:
    customer = app.test_client()
    page = customer.get(f"/orders/{reference}", query_string={"token": access}).get_data(as_text=True)
    data = customer.get(f"/orders/{reference}", query_string={"token": access}, headers=JSON).get_json()
    return page, data


def _refund(app, client, token, reference, amount: int) -> None:
    data = {"csrf_token": token, "reason": "customer asked", "restock": "no", "amount": str(amount)}
    assert client.post(f"/console/orders/{reference}/refund", data=data, headers=JSON).status_code == 200
    run_everything(app)


def test_the_customer_page_the_json_and_the_console_summary_say_the_same_money(make_fresh_app, sandbox, mail_folder):
    paid = paid_with_operator(make_fresh_app, sandbox, "SOCK-M", 2)
    app, client, token, oid, total, currency = paid.app, paid.client, paid.token, paid.oid, paid.total, paid.currency
    reference, access = paid.reference, paid.access_token

    def money(amount: int) -> str:
        return format_money(amount, currency)

    # Partly refunded through the provider: every place says 5.00 back and the same net.
    _refund(app, client, token, reference, 500)
    page, data = _customer(app, reference, access)
    charged = data["charged"] if data["charged"] is not None else total
    assert (charged, data["refunded"], data.get("refunds_settled")) == (total, 500, None)
    assert f"Partially refunded: {money(500)} went back to your payment; you paid {money(total - 500)} in all" in page
    assert _console_summary(client, reference) == {
        "Paid": money(charged),
        "Refunded": money(data["refunded"]),
        "Net": money(charged - data["refunded"]),
    }

    # A further 7.00 fails at the provider and an operator settles it outside it: the JSON keeps
    # `refunded` for what went back through the provider and names the settled refund; the
    # console's Refunded counts both, and its Net is what the shop keeps.
    sandbox.faults(refunds_pending=True)
    _refund(app, client, token, reference, 700)
    with app.app_context():
        second = db.session.execute(select(Refund).where(Refund.order_id == oid, Refund.amount == 700)).scalar_one()
        second_id, provider_id = second.id, second.provider_refund_id
        db.session.remove()
    assert provider_id
    sandbox.refund_outcome(provider_id, "failed")
    with app.app_context():  # the sweep asks the provider about the pending refund
        run_cycle(now=utcnow() + timedelta(hours=3))
        assert db.session.get(Refund, second_id).status == RefundStatus.FAILED
        db.session.remove()
    settle = {"csrf_token": token, "reason": "Bank transfer by hand"}
    assert client.post(f"/console/refunds/{second_id}/settle", data=settle, headers=JSON).status_code == 200

    page, data = _customer(app, reference, access)
    settled = sum(r["amount"] for r in data["refunds"] if r["id"] in data["refunds_settled"])
    assert (data["refunded"], data["refunds_settled"], settled) == (500, [second_id], 700)
    assert f"The refund of {money(700)} could not go back through the payment provider, so we settled it" in page
    assert f"Partially refunded: {money(500)} went back to your payment; you paid {money(total - 500)} in all" in page
    assert _console_summary(client, reference) == {
        "Paid": money(charged),
        "Refunded": money(data["refunded"] + settled),
        "Net": money(charged - data["refunded"] - settled),
    }
