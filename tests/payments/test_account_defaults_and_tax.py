"""What the shop charges and accepts never depends on the provider account's defaults
(docs/REFERENCE.md, Stripe account): every session states its tax, its currency handling and its
payment methods; with TAX_MODE=stripe the tax is charged, proven, saved and refunded exactly.
Real database, Redis and sandbox (its account set as a Dashboard would set it)."""

from __future__ import annotations

import email
import email.policy
from pathlib import Path

from sqlalchemy import select

from factories import seed_catalog_rows
from payment_helpers import HTML, Shopper, order_id, run_due_commands
from shop.domain.deadlines import utcnow
from shop.domain.payment import TaxMode
from shop.extensions import db
from shop.models import Order, OutboxDelivery, PaymentProofRefusal, Refund
from shop.outbox.dispatch import run_delivery
from shop.payments.apply import reconcile_order
from shop.provider import guard
from shop.saga.operator_refunds import RefundOutcome, refund_order
from support import log_in

GERMANY = {"country": "DE", "line1": "Unter den Linden 1", "city": "Berlin", "postal_code": "10117"}
OREGON = {"country": "US", "line1": "1 Main St", "city": "Portland", "postal_code": "97201", "state": "OR"}
# An account as a Dashboard leaves it after "enable tax by default", Adaptive Pricing and OXXO.
EVERY_DEFAULT_ON = dict(
    automatic_tax_default="enabled_when_possible",
    tax_rates={"DE": 1900, "US": 800},
    adaptive_pricing_default=True,
    payment_methods=["card", "oxxo"],
)


def _row(app, ref: str) -> Order:
    with app.app_context():
        row = db.session.get(Order, order_id(app, ref))
        db.session.expunge_all()
        db.session.remove()
        return row


def _pay(app, sandbox, shopper: Shopper, address: dict) -> tuple[dict, dict]:
    """An order placed, paid at the sandbox from `address`, and applied as the console's
    reconcile applies it: (the order's JSON when placed, the session as the provider has it)."""
    order = shopper.place()
    session = sandbox.set_outcome(order["payment"]["session_id"], "paid", address=address)
    with app.app_context():
        reconcile_order(order_id(app, order["reference"]))
        db.session.remove()
    return order, session


def _dollars(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def _receipt(app, oid: int) -> str:
    """The order's receipt, sent as the worker sends it, as the mailer wrote it (no SMTP_URL)."""
    with app.app_context():
        [delivery] = db.session.execute(
            select(OutboxDelivery.id).where(
                OutboxDelivery.order_id == oid, OutboxDelivery.handler == "send_order_confirmation"
            )
        ).scalars()
        db.session.remove()
        assert run_delivery(delivery) == "done"
        db.session.remove()
    [mail] = Path(app.instance_path, "mail").glob("*order_paid*.eml")
    return email.message_from_bytes(mail.read_bytes(), policy=email.policy.default).get_body(("plain",)).get_content()


def _refunds_at_provider(sandbox) -> list[int]:
    with sandbox.sandbox.lock:
        return sorted(r.amount for r in sandbox.sandbox.refunds.values())


def test_on_an_account_with_every_default_on_a_checkout_charges_exactly_the_order_total_and_keeps_it(
    make_fresh_app, sandbox
):
    sandbox.account(**EVERY_DEFAULT_ON)
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60)
    shopper = Shopper(app, seed_catalog_rows(app))

    order, session = _pay(app, sandbox, shopper, GERMANY)

    # The session said no tax, no local currency and cards only, whatever the account's defaults.
    assert session["automatic_tax"]["enabled"] is False
    assert session["payment_method_types"] == ["card"]
    assert session.get("presentment_details") is None
    assert (session["amount_total"], session["currency"]) == (order["total"], order["currency"])
    row = _row(app, order["reference"])
    assert (row.status, row.charged, row.tax) == ("Paid", order["total"], 0)
    assert _refunds_at_provider(sandbox) == []


def test_an_account_that_would_tax_a_session_of_a_shop_without_tax_never_has_it_taken_as_payment(
    make_fresh_app, sandbox
):
    """The proof's own guard, should a session come back taxed all the same."""
    sandbox.account(**EVERY_DEFAULT_ON)
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60, TAX_MODE=TaxMode.STRIPE)
    shopper = Shopper(app, seed_catalog_rows(app))
    order = shopper.place()  # asked for with tax...
    sandbox.set_outcome(order["payment"]["session_id"], "paid", address=GERMANY)
    app.config["TAX_MODE"] = TaxMode.NONE  # ...and applied by a shop that charges none

    with app.app_context():
        applied = reconcile_order(order_id(app, order["reference"]))
        refusals = db.session.execute(select(PaymentProofRefusal.problems)).scalars().all()
        db.session.remove()

    assert applied.outcome == "proof_refused"
    assert _row(app, order["reference"]).status == "PaymentInitiated"
    [problems] = refusals
    assert "calculated tax" in problems and f"!= order total {order['total']}" in problems


def test_with_stripe_tax_the_tax_is_charged_proven_saved_shown_emailed_and_an_operator_refunds_what_was_charged(
    make_fresh_app, sandbox, monkeypatch, tmp_path
):
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    sandbox.account(tax_rates={"US": 800})
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60, TAX_MODE=TaxMode.STRIPE)
    shopper = Shopper(app, seed_catalog_rows(app))
    assert shopper.place()["tax"] is None  # null until paid

    order, session = _pay(app, sandbox, shopper, OREGON)

    tax = order["total"] * 800 // 10_000
    assert session["automatic_tax"] == {**session["automatic_tax"], "enabled": True, "status": "complete"}
    assert (session["amount_subtotal"], session["total_details"]["amount_tax"]) == (order["total"], tax)
    row = _row(app, order["reference"])
    assert (row.status, row.tax, row.charged) == ("Paid", tax, order["total"] + tax)
    shown = shopper.order(order["reference"])
    assert (shown["total"], shown["tax"], shown["charged"]) == (order["total"], tax, order["total"] + tax)
    page = shopper.client.get(f"/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
    assert (
        f'Tax</th><td class="num">{_dollars(tax)}' in page
        and f'Total charged</th><th class="num">{_dollars(order["total"] + tax)}' in page
    )
    receipt = _receipt(app, row.id)
    assert f"Tax: {_dollars(tax)}" in receipt and f"Total paid: {_dollars(order['total'] + tax)}" in receipt
    operator = app.test_client()
    log_in(app, operator)
    console = operator.get(f"/console/orders/{order['reference']}", headers=HTML).get_data(as_text=True)
    assert f"+ tax {_dollars(tax)} = <strong>{_dollars(order['total'] + tax)} charged</strong>" in console

    # More than the goods but not more than was charged may be refunded; then nothing is left.
    with app.app_context():
        first = refund_order(
            row.id, amount=order["total"] + 1, reason="returned", restock=False, request_key="k1", operator="op"
        )
        rest = refund_order(row.id, amount=None, reason="tax back", restock=False, request_key="k2", operator="op")
        over = refund_order(row.id, amount=1, reason="again", restock=False, request_key="k3", operator="op")
        amounts = db.session.execute(select(Refund.amount).order_by(Refund.id)).scalars().all()
        db.session.remove()
    assert (first.outcome, rest.outcome, over.outcome) == (
        RefundOutcome.DONE,
        RefundOutcome.DONE,
        RefundOutcome.REFUSED,
    )
    assert amounts == [order["total"] + 1, tax - 1]
    run_due_commands(app, utcnow())
    assert _refunds_at_provider(sandbox) == sorted([order["total"] + 1, tax - 1])


def test_a_customers_cancel_met_by_lock_timeouts_expires_the_session_with_one_key_and_pauses_no_one(make_shop, sandbox):
    app = make_shop(sandbox=True)
    shopper = Shopper(app)
    order = shopper.place()
    sid = order["payment"]["session_id"]
    sandbox.faults(lock_timeout=3)

    answer = shopper.cancel(order["reference"], order["version"])

    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert shopper.order(order["reference"])["status"] == "Cancelled"
    expires = [c for c in sandbox.requests() if c["method"] == "POST" and c["path"].endswith(f"{sid}/expire")]
    assert [c["status"] for c in expires] == [429, 429, 429, 200], expires
    keys = {c["idempotency_key"] for c in expires}
    assert len(keys) == 1 and None not in keys, keys
    with sandbox.sandbox.lock:
        assert sandbox.sandbox.sessions[sid].status == "expired"
    # Not a rate limit: no process was told to hold its calls.
    with app.app_context():
        assert guard.get().budget.local.paused_until == 0
