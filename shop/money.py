"""Money as people read it, in one place: the storefront, the console and the emails all show an
amount the way the provider's payment page does ("$28.00", "¥1,500"), whatever the currency.

Amounts are kept in the currency's minor unit, as Stripe counts them: most currencies have two
decimals, Stripe's zero-decimal currencies none (1500 JPY is ¥1,500) and its three-decimal ones
three. Babel supplies the symbols, grouping and the digits each currency is shown with."""

from __future__ import annotations

import functools
from decimal import Decimal

from babel.numbers import format_currency

LOCALE = "en_US"

# Stripe's lists (its docs, "Zero-decimal currencies" and "Three-decimal currencies").
ZERO_DECIMAL = frozenset(
    {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv", "xaf", "xof", "xpf"}
)
THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})


def minor_digits(currency: str) -> int:
    code = (currency or "").lower()
    return 0 if code in ZERO_DECIMAL else 3 if code in THREE_DECIMAL else 2


# Pure, and called for every amount of every page and email (a receipt's lines, the console's
# lists): Babel parses the locale and the pattern on each call, a tenth of an email's CPU.
@functools.lru_cache(maxsize=4096)
def format_money(amount: int | None, currency: str | None, locale: str = LOCALE) -> str:
    """`amount` in the currency's minor unit -> "$28.00"; "–" for no amount."""
    if amount is None:
        return "–"
    code = (currency or "").upper()
    if not code:
        return f"{amount:,}"
    major = Decimal(int(amount)).scaleb(-minor_digits(code))
    try:
        return format_currency(major, code, locale=locale)
    except Exception:  # a code Babel does not know: still an honest amount
        return f"{major:,.{minor_digits(code)}f} {code}"
