"""What the shop asks of the provider for one payment attempt: a Checkout Session's parameters.

A session states everything an account's Dashboard defaults would otherwise decide
(docs/REFERENCE.md, Stripe account): tax is calculated only under TAX_MODE=stripe (an account that
enables tax by default would otherwise charge more than the order's total), Adaptive Pricing is off
(the customer pays in the order's currency, the amount the proof checks), and only the payment
methods of PAYMENT_METHODS are offered, narrowing the account's dynamic list
(`allowed_payment_method_types`: since 2026-09-30.endive a session may not list its own)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from ..domain.payment import TaxMode
from ..domain.payment_methods import DEFAULT_PAYMENT_METHODS
from .mark import shop_mark

if TYPE_CHECKING:  # the SDK's typed parameters, for the checker only
    from stripe.params.checkout import SessionCreateParams


def session_params(
    *,
    order_id: int,
    reference: str,
    attempt: int,
    lines,
    currency: str,
    email: str,
    success_url: str,
    cancel_url: str,
    expires_at: datetime,
    ship_to: tuple[str, ...] | None = None,
    tax_mode: TaxMode = TaxMode.NONE,
    payment_methods: tuple[str, ...] = DEFAULT_PAYMENT_METHODS,
    hold_cards: bool = False,
) -> SessionCreateParams:
    """`ship_to`: the order holds goods to ship, so the payment page asks for a shipping address
    in one of these countries (with Stripe Tax, that address is the one taxed). `hold_cards`
    (CAPTURE_MODE=dispatch): a card payment is only authorized, captured when the order ships;
    asked per method, so a method without manual capture still captures at once."""
    params: SessionCreateParams = {
        "mode": "payment",
        "client_reference_id": reference,
        "metadata": {"order_id": str(order_id), "reference": reference, "shop": shop_mark()},
        # On the attempt's PaymentIntent too: a declined card's payment_intent.payment_failed names
        # the order and the attempt it was declined on, so an old attempt's decline is not news.
        "payment_intent_data": {"metadata": {"order_id": str(order_id), "attempt": str(attempt)}},
        "customer_email": email,
        "success_url": success_url,
        "cancel_url": cancel_url,
        "expires_at": int(expires_at.timestamp()),
        "line_items": [
            {
                "quantity": line.quantity,
                "price_data": {
                    "currency": currency,
                    "unit_amount": line.unit_price,
                    "product_data": {"name": f"{line.name} ({line.sku})"},
                },
            }
            for line in lines
        ],
        "automatic_tax": {"enabled": tax_mode == TaxMode.STRIPE},
        "adaptive_pricing": {"enabled": False},
        # Checked against the SDK's list of types when the settings were read (PAYMENT_METHODS).
        "allowed_payment_method_types": cast("Any", list(payment_methods)),
    }
    if hold_cards:
        params["payment_method_options"] = {"card": {"capture_method": "manual"}}
    if ship_to:
        params["shipping_address_collection"] = {"allowed_countries": cast("Any", list(ship_to))}
    return params
