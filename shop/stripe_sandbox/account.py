"""The Stripe account behind the sandbox: the Dashboard settings a session or an endpoint falls back on.

At Stripe these live in the Dashboard, not in a request: whether Checkout calculates tax when the
integration says nothing (`automatic_tax_default`), the tax the account is registered to collect per
country (`tax_rates`, in basis points, exclusive: added on top of the line items), whether Adaptive
Pricing shows a customer their own currency (`adaptive_pricing_default`), the dynamic payment
methods switched on (`payment_methods`), how long a voucher stays payable
(`voucher_expires_after_days`), the API version a new webhook endpoint gets
(`default_api_version`) and how long a card authorization holds (`authorization_validity_seconds`).
`POST /_sandbox/account` changes any of them, `GET /_sandbox/account` reads them; a reset and a
fresh sandbox start from the defaults below, and the state file keeps them.

Also here, because they read only these settings: the tax on a subtotal, the amount a customer
is shown in their own currency, and the payment method types a session offers.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from .objects import API_VERSION

AUTOMATIC_TAX_DEFAULTS = ("disabled", "enabled_when_possible")
# The payment method types Stripe's Checkout knows (its `excluded_payment_method_types` enum);
# any of them can be switched on for the account.
PAYMENT_METHOD_TYPES = frozenset(
    "acss_debit affirm afterpay_clearpay alipay alma amazon_pay au_becs_debit bacs_debit bancontact "
    "billie bizum blik boleto card cashapp crypto customer_balance eps fpx giropay grabpay ideal "
    "kakao_pay klarna konbini kr_card link mb_way mobilepay multibanco naver_pay nz_bank_account oxxo "
    "p24 pay_by_bank payco paynow paypal payto pix promptpay revolut_pay samsung_pay satispay scalapay "
    "sepa_debit sofort sunbit swish twint upi us_bank_account wechat_pay zip".split()
)
# Vouchers the customer pays in cash after checkout, and the days Stripe lets each stay payable
# (`payment_method_options[<type>][expires_after_days]`): OXXO 1 to 7, Boleto 0 to 60, Konbini 1 to 60.
VOUCHER_DAYS = {"oxxo": (1, 7), "boleto": (0, 60), "konbini": (1, 60)}
# The account's own default must suit every voucher type, so it stays within all three ranges.
VOUCHER_DEFAULT_DAYS = (1, 7)
MAX_AUTHORIZATION_SECONDS = 31 * 24 * 3600
MAX_TAX_BASIS_POINTS = 10_000

_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(\.[a-z]+)?$")
_COUNTRY = re.compile(r"^[A-Z]{2}$")

# Adaptive Pricing's currencies: the one each country's customers see, and a fixed rate table
# (units of the currency per US dollar) so the sandbox's conversions are the same on every run.
COUNTRY_CURRENCY = {
    "US": "usd", "GB": "gbp", "IE": "eur", "DE": "eur", "FR": "eur", "ES": "eur", "IT": "eur",
    "NL": "eur", "JP": "jpy", "MX": "mxn", "BR": "brl", "CA": "cad", "AU": "aud", "CH": "chf",
}  # fmt: skip
RATES_PER_USD = {
    "usd": Decimal("1"),
    "eur": Decimal("0.92"),
    "gbp": Decimal("0.79"),
    "jpy": Decimal("150"),
    "mxn": Decimal("17"),
    "brl": Decimal("5"),
    "cad": Decimal("1.36"),
    "aud": Decimal("1.52"),
    "chf": Decimal("0.88"),
}
_ZERO_DECIMAL = {"jpy", "krw", "vnd", "clp", "pyg", "ugx", "xaf", "xof"}


class AccountError(ValueError):
    """A setting refused: its message names the field and what it takes."""


@dataclass
class Account:
    automatic_tax_default: str = "disabled"
    tax_rates: dict[str, int] = field(default_factory=dict)
    adaptive_pricing_default: bool = False
    payment_methods: list[str] = field(default_factory=lambda: ["card"])
    voucher_expires_after_days: int = 3
    default_api_version: str = API_VERSION
    authorization_validity_seconds: int = 7 * 24 * 3600

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def update(self, changes: dict[str, Any]) -> None:
        """Apply settings already checked by `read_changes`."""
        for key, value in changes.items():
            setattr(self, key, value)

    # -- what sessions ask of the account ---------------------------------------------

    def tax_on(self, subtotal: int, country: str) -> int:
        """Exclusive tax on `subtotal` for a customer in `country`: none where the account
        collects none. Rounded half up to the currency's smallest unit."""
        basis_points = self.tax_rates.get(country, 0)
        return int((Decimal(subtotal) * basis_points / 10_000).quantize(Decimal(1), ROUND_HALF_UP))

    def payment_method_types(self, allowed: list[str] | None, excluded: list[str] | None) -> list[str]:
        """The dynamic list, narrowed as the session asks (the caller has refused both at once
        and an allowed type the account does not offer)."""
        if allowed is not None:
            return [kind for kind in self.payment_methods if kind in allowed]
        return [kind for kind in self.payment_methods if kind not in (excluded or [])]


def presentment(amount: int, currency: str, country: str) -> tuple[int, str] | None:
    """What a customer in `country` is shown for `amount` in `currency` under Adaptive Pricing:
    (amount, currency) in their own currency, or None when it is the same currency or one the
    rate table does not hold."""
    target = COUNTRY_CURRENCY.get(country)
    if target is None or target == currency or currency not in RATES_PER_USD:
        return None
    major = Decimal(amount) / _minor_units(currency)
    converted = major / RATES_PER_USD[currency] * RATES_PER_USD[target] * _minor_units(target)
    return int(converted.quantize(Decimal(1), ROUND_HALF_UP)), target


def _minor_units(currency: str) -> int:
    return 1 if currency in _ZERO_DECIMAL else 100


# -- reading POST /_sandbox/account ----------------------------------------------------


ACCOUNT_FIELDS = tuple(f.name for f in fields(Account))


def read_changes(data: dict[str, Any]) -> dict[str, Any]:
    """Check each given setting; the changes to apply, or AccountError naming the first bad one."""
    unknown = sorted(set(data) - set(ACCOUNT_FIELDS))
    if unknown:
        raise AccountError(f"Unknown field(s): {', '.join(unknown)}; expected any of {', '.join(ACCOUNT_FIELDS)}")
    return {key: _READERS[key](value) for key, value in data.items()}


def _automatic_tax_default(value: Any) -> str:
    if value not in AUTOMATIC_TAX_DEFAULTS:
        raise AccountError(f"automatic_tax_default must be one of {', '.join(AUTOMATIC_TAX_DEFAULTS)}; got {value!r}")
    return value


def _tax_rates(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise AccountError(f"tax_rates must be an object of country code -> basis points; got {value!r}")
    rates: dict[str, int] = {}
    for country, basis_points in value.items():
        if not _COUNTRY.match(country):
            raise AccountError(f"tax_rates: {country!r} is not a two-letter country code in capitals, such as DE")
        if not _whole(basis_points) or not 0 <= basis_points <= MAX_TAX_BASIS_POINTS:
            raise AccountError(
                f"tax_rates[{country}] must be whole basis points from 0 to {MAX_TAX_BASIS_POINTS}; "
                f"got {basis_points!r}"
            )
        rates[country] = basis_points
    return rates


def _adaptive_pricing_default(value: Any) -> bool:
    if not isinstance(value, bool):
        raise AccountError(f"adaptive_pricing_default must be true or false; got {value!r}")
    return value


def _payment_methods(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise AccountError(f"payment_methods must be a non-empty list of payment method types; got {value!r}")
    for kind in value:
        if kind not in PAYMENT_METHOD_TYPES:
            raise AccountError(f"payment_methods: {kind!r} is not a payment method type Checkout knows")
    if len(set(value)) != len(value):
        raise AccountError("payment_methods lists a type twice")
    return list(value)


def _voucher_days(value: Any) -> int:
    low, high = VOUCHER_DEFAULT_DAYS
    if not _whole(value) or not low <= value <= high:
        raise AccountError(
            f"voucher_expires_after_days must be a whole number of days from {low} to {high} "
            f"(what OXXO, Boleto and Konbini all accept); got {value!r}"
        )
    return value


def _api_version(value: Any) -> str:
    if not isinstance(value, str) or not _API_VERSION.match(value):
        raise AccountError(f"default_api_version must be an API version such as {API_VERSION}; got {value!r}")
    return value


def _authorization_seconds(value: Any) -> int:
    if not _whole(value) or not 1 <= value <= MAX_AUTHORIZATION_SECONDS:
        raise AccountError(
            f"authorization_validity_seconds must be a whole number from 1 to {MAX_AUTHORIZATION_SECONDS}; "
            f"got {value!r}"
        )
    return value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_READERS = {
    "automatic_tax_default": _automatic_tax_default,
    "tax_rates": _tax_rates,
    "adaptive_pricing_default": _adaptive_pricing_default,
    "payment_methods": _payment_methods,
    "voucher_expires_after_days": _voucher_days,
    "default_api_version": _api_version,
    "authorization_validity_seconds": _authorization_seconds,
}


def is_api_version(value: str) -> bool:
    return bool(_API_VERSION.match(value))
