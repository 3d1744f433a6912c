"""The payment proof as this shop applies it: a session pays an order when its amount, currency
and tax are what TAX_MODE says (shop.domain.payment); the accepted payment's charge is then saved
with it, for every later refund to refund from."""

from __future__ import annotations

from flask import current_app

from ..domain.payment import ProofVerdict, TaxMode, charged_tax, check_payment_proof
from ..provider.views import SessionView
from ..store.order_store import LoadedOrder


def tax_mode() -> TaxMode:
    return TaxMode(current_app.config.get("TAX_MODE", TaxMode.NONE))


def proof_of(order: LoadedOrder, view: SessionView) -> ProofVerdict:
    """Whether the session pays this order."""
    return check_payment_proof(
        order_total=order.total,
        order_currency=order.currency,
        amount_total=view.amount_total,
        currency=view.currency,
        payment_status=view.payment_status,
        tax=view.tax,
        tax_mode=tax_mode(),
    )


def charge_of(order: LoadedOrder, view: SessionView) -> None:
    """What the accepted payment charged and where its goods go, saved with the payment."""
    assert view.amount_total is not None  # the proof accepted it
    order.charged_with(view.amount_total, charged_tax(tax_mode(), view.tax))
    order.ships_to(view.shipping_details)
