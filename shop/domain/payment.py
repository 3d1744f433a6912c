"""PaymentProof: when a provider's session counts as payment of a given order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProofVerdict:
    accepted: bool
    problems: tuple[str, ...] = ()

    def describe(self) -> str:
        return "; ".join(self.problems) or "accepted"


def check_payment_proof(
    *, order_total: int, order_currency: str, amount_total, currency, payment_status
) -> ProofVerdict:
    problems = []
    if payment_status != "paid":
        problems.append(f"payment_status is {payment_status!r}, not 'paid'")
    if amount_total != order_total:
        problems.append(f"amount_total {amount_total} != order total {order_total}")
    if (currency or "").lower() != (order_currency or "").lower():
        problems.append(f"currency {currency!r} != order currency {order_currency!r}")
    return ProofVerdict(not problems, tuple(problems))
