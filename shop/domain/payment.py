"""PaymentProof: when a provider's session counts as payment of a given order.

The order's total is the goods. Without tax (TaxMode.NONE) the session must charge exactly that,
and must not have had tax calculated at all: an account that calculates tax by default would
otherwise charge more than the order, and the difference is nobody's. With Stripe Tax
(TaxMode.STRIPE) the session's subtotal is the goods, its tax calculation must have completed,
and it charges the subtotal plus that tax, no more and no less (docs/REFERENCE.md, Settings)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TaxMode(StrEnum):
    """TAX_MODE: who adds tax to an order's total at checkout."""

    NONE = "none"  # no tax: every session says so explicitly
    STRIPE = "stripe"  # Stripe Tax adds exclusive tax from the customer's address


# automatic_tax.status once the provider has calculated the session's tax.
TAX_COMPLETE = "complete"


@dataclass(frozen=True)
class ProofVerdict:
    accepted: bool
    problems: tuple[str, ...] = ()

    def describe(self) -> str:
        return "; ".join(self.problems) or "accepted"


@dataclass(frozen=True)
class SessionTax:
    """What a session says about tax: whether it calculated any (automatic_tax.enabled), how far
    (automatic_tax.status), the goods before tax (amount_subtotal) and the tax
    (total_details.amount_tax). None: the session did not say."""

    enabled: bool | None = None
    status: str | None = None
    amount_subtotal: int | None = None
    amount_tax: int | None = None


NO_TAX_REPORTED = SessionTax()


def check_payment_proof(
    *,
    order_total: int,
    order_currency: str,
    amount_total,
    currency,
    payment_status,
    tax: SessionTax = NO_TAX_REPORTED,
    tax_mode: TaxMode = TaxMode.NONE,
) -> ProofVerdict:
    problems = []
    if payment_status != "paid":
        problems.append(f"payment_status is {payment_status!r}, not 'paid'")
    if tax_mode is TaxMode.STRIPE:
        problems += _taxed_total_problems(order_total, amount_total, tax)
    else:
        if amount_total != order_total:
            problems.append(f"amount_total {amount_total} != order total {order_total}")
        if tax.enabled:
            problems.append("the session calculated tax, which this shop does not charge (TAX_MODE=none)")
        if tax.amount_subtotal is not None and tax.amount_subtotal != order_total:
            problems.append(f"amount_subtotal {tax.amount_subtotal} != order total {order_total}")
    if (currency or "").lower() != (order_currency or "").lower():
        problems.append(f"currency {currency!r} != order currency {order_currency!r}")
    return ProofVerdict(not problems, tuple(problems))


def _taxed_total_problems(order_total: int, amount_total, tax: SessionTax) -> list[str]:
    """TaxMode.STRIPE: the goods as the subtotal, a completed calculation, and the total charged
    exactly the subtotal plus its tax."""
    problems = []
    if not tax.enabled:
        problems.append("the session did not calculate tax (TAX_MODE=stripe)")
    if tax.status != TAX_COMPLETE:
        problems.append(f"automatic_tax.status is {tax.status!r}, not {TAX_COMPLETE!r}")
    if tax.amount_subtotal != order_total:
        problems.append(f"amount_subtotal {tax.amount_subtotal} != order total {order_total}")
    if not isinstance(tax.amount_tax, int) or tax.amount_tax < 0:
        problems.append(f"total_details.amount_tax is {tax.amount_tax!r}")
    elif not isinstance(tax.amount_subtotal, int) or amount_total != tax.amount_subtotal + tax.amount_tax:
        problems.append(f"amount_total {amount_total} != amount_subtotal {tax.amount_subtotal} + tax {tax.amount_tax}")
    return problems


def charged_tax(tax_mode: TaxMode, tax: SessionTax) -> int:
    """The tax an accepted payment carries: 0 without tax, the session's own with Stripe Tax (the
    proof has checked it is there)."""
    return (tax.amount_tax or 0) if tax_mode is TaxMode.STRIPE else 0


class CaptureMode(StrEnum):
    """CAPTURE_MODE: when the customer's money is taken. `checkout`: at payment. `dispatch`: held
    at payment (the order is Authorized) and captured when the order ships."""

    CHECKOUT = "checkout"
    DISPATCH = "dispatch"
