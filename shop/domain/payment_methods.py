"""Which payment method types a checkout may offer (PAYMENT_METHODS, docs/REFERENCE.md, Settings).

An order holds its stock only until its pay-by time, 30 minutes by default. A method whose money
is confirmed while the customer is on the payment page (a card, a wallet, a redirect to the bank
that answers at once) fits in that window. A method whose money arrives later does not: a voucher
(OXXO, Boleto, Konbini, Multibanco, Pix) stays payable for days, a bank debit or a bank transfer
confirms in days. Each such payment would arrive for an order already cancelled and its stock
given back, and become a refund. The shop refuses to start with one in its list."""

from __future__ import annotations

# Paid after the customer leaves the page, up to days later: never offered.
DELAYED = {
    "acss_debit": "a pre-authorized debit, confirmed in days",
    "au_becs_debit": "a bank debit, confirmed in days",
    "bacs_debit": "a bank debit, confirmed in days",
    "boleto": "a voucher, payable for days",
    "crypto": "a transfer confirmed after the customer leaves the page",
    "customer_balance": "a bank transfer, arriving in days",
    "konbini": "a voucher, payable for days",
    "multibanco": "a voucher, payable for days",
    "nz_bank_account": "a bank debit, confirmed in days",
    "oxxo": "a voucher, payable for days",
    "payto": "a bank debit, confirmed after the customer leaves the page",
    "pix": "a voucher, payable after the customer leaves the page",
    "sepa_debit": "a bank debit, confirmed in days",
    "sofort": "a bank payment, confirmed in days",
    "us_bank_account": "a bank debit, confirmed in days",
}

# Confirmed while the customer is on the payment page.
IMMEDIATE = frozenset(
    {
        "affirm", "afterpay_clearpay", "alipay", "alma", "amazon_pay", "bancontact", "billie", "bizum", "blik",
        "card", "cashapp", "eps", "fpx", "giropay", "grabpay", "ideal", "kakao_pay", "klarna", "kr_card", "link",
        "mb_way", "mobilepay", "naver_pay", "pay_by_bank", "payco", "paynow", "paypal", "paypay", "promptpay",
        "revolut_pay", "samsung_pay", "satispay", "scalapay", "sequra", "sunbit", "swish", "twint", "upi",
        "wechat_pay", "zip",
    }
)  # fmt: skip

DEFAULT_PAYMENT_METHODS = ("card",)


def refusal(method: str) -> str | None:
    """Why `method` may not be offered, in a few words; None when it may."""
    if method in IMMEDIATE:
        return None
    if method in DELAYED:
        return f"{method} is {DELAYED[method]}: its money could arrive after an order's pay-by time"
    return f"{method} is not a payment method type this shop knows"
