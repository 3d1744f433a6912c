"""What an operator typed into a console list's filters, read and checked, and turned into the
conditions the lists (queries.py) and their CSV exports (export.py) share.

The filters are the same on every list where they make sense (docs/REFERENCE.md, Console):
`q` (text: what it matches is each list's own, in queries.py), `from` / `to` (a date, or a date and time, in
UTC as the console shows them; `to` a bare date takes that whole day), `amount` / `amount_min` /
`amount_max` (in the currency's own units as the list shows them: 18.00 is $18.00, 1500 is
¥1,500). A value that cannot be read is never guessed at and never a 500: it comes back as
words for the page, with what was typed left in the form to correct."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation

from sqlalchemy import ColumnElement, and_, false, func, not_, or_

from ..money import THREE_DECIMAL, ZERO_DECIMAL, minor_digits
from ..web.answers import respond
from ..web.numbers import INT4_MAX

# Digits an amount may have before its decimal point: a trillion is more than any order, and
# keeps the minor-unit bounds inside a 64-bit integer (SQLite refuses larger ones outright).
MOST_WHOLE_DIGITS = 12
# What an operator may paste along with an amount copied from a page: "$1,500.00", "€ 18". A comma
# is taken only as the pages write it, between groups of three digits: "18,50" is not guessed to
# be 18.50 (nor 1850).
_AMOUNT_DECORATION = re.compile(r"[\s$€£¥]")
_GROUPED = re.compile(r"[+-]?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]*)?")  # ASCII digits only, as every number typed
TEXT_LIMIT = 254


@dataclass(frozen=True)
class Filters:
    """The filters of one list as read. `typed` is what the form shows back (the raw values);
    `errors` the sentences for the values that could not be read (none were applied then)."""

    q: str = ""
    since: datetime | None = None  # inclusive
    before: datetime | None = None  # exclusive
    amount_min: Decimal | None = None
    amount_max: Decimal | None = None
    typed: dict = field(default_factory=dict)
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_json(self) -> dict:
        """The filters as the JSON answer names them (what was typed, trimmed)."""
        return {"q": self.q, **self.typed}


def read_filters(args, *, amounts: bool = False) -> Filters:
    """The common filters from a request's query string (`args`, a MultiDict); `amounts` for the
    lists whose rows carry money (orders, refunds)."""
    typed = {"q": (args.get("q") or "").strip()[:TEXT_LIMIT]}
    for name in ("from", "to") + (("amount", "amount_min", "amount_max") if amounts else ()):
        typed[name] = (args.get(name) or "").strip()[:64]
    errors: list[str] = []
    since = _instant(typed["from"], "from", errors)
    until = _instant(typed["to"], "to", errors)
    before = None
    if until is not None:  # `to` takes in the whole day, minute or second it names
        try:
            before = until[0] + until[1]
        except OverflowError:
            before = None  # to the end of the year 9999: no upper bound at all
    since_at = since[0] if since else None
    if since_at is not None and before is not None and since_at >= before:
        errors.append(f"The date range ends ({typed['to']}) before it starts ({typed['from']}); swap them.")
    low = high = None
    if amounts:
        exact = _amount(typed["amount"], "Amount", errors)
        low = _amount(typed["amount_min"], "Lowest amount", errors)
        high = _amount(typed["amount_max"], "Highest amount", errors)
        if exact is not None:
            if (low is not None and low != exact) or (high is not None and high != exact):
                errors.append("Give either an exact amount or a lowest and highest amount, not both.")
            low = high = exact
        elif low is not None and high is not None and low > high:
            errors.append(
                f"The lowest amount ({typed['amount_min']}) is above the highest ({typed['amount_max']}); swap them."
            )
    if errors:
        return Filters(typed=typed, errors=tuple(errors))
    return Filters(q=typed["q"], since=since_at, before=before, amount_min=low, amount_max=high, typed=typed)


def _instant(text: str, name: str, errors: list[str]) -> tuple[datetime, timedelta] | None:
    """(the instant in UTC, the span it names: a day, a minute or a second), or None when nothing was typed or it
    could not be read (then with a sentence in `errors`)."""
    if not text:
        return None
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            return datetime.combine(date.fromisoformat(text), time(), tzinfo=UTC), timedelta(days=1)
        shape = re.fullmatch(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})(:\d{2})?(?: ?(?:UTC|Z))?", text)
        if shape:
            value = datetime.fromisoformat(f"{shape[1]}T{shape[2]}{shape[3] or ''}")
            return value.replace(tzinfo=UTC), timedelta(seconds=1 if shape[3] else 60)
    except ValueError:
        pass  # the right shape, but no such day or time (2026-02-30, 25:00)
    errors.append(
        f"The {'start' if name == 'from' else 'end'} date “{text}” is not a date. "
        "Write it as 2026-11-30, or 2026-11-30 14:05 for a time (UTC)."
    )
    return None


def _amount(text: str, what: str, errors: list[str]) -> Decimal | None:
    """An amount in the currency's own units ("18.00"), or None when nothing was typed or it
    could not be read (then with a sentence in `errors`)."""
    if not text:
        return None
    cleaned = _AMOUNT_DECORATION.sub("", text)
    if "," in cleaned:
        if not _GROUPED.fullmatch(cleaned):
            errors.append(f"{what} “{text}” is not an amount. Write it with a point before the cents, e.g. 18.50.")
            return None
        cleaned = cleaned.replace(",", "")
    try:
        value = Decimal(cleaned) if re.fullmatch(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", cleaned) else None
    except InvalidOperation:
        value = None
    if value is None:
        errors.append(f"{what} “{text}” is not an amount. Write it as the list shows it, e.g. 18.00.")
        return None
    if value < 0:
        errors.append(f"{what} “{text}” is negative; amounts start at 0.")
        return None
    if value >= Decimal(10) ** MOST_WHOLE_DIGITS:
        errors.append(f"{what} “{text}” is larger than any order could be.")
        return None
    return value


# -- conditions --------------------------------------------------------------------------------


def contains(column, text: str, *, upper: bool = False):
    """`column` holds `text` anywhere, in any case. References are stored upper case, so they are
    compared as such (`upper`); other text through lower(). LIKE's own wildcards in what was
    typed (`%`, `_`) are matched as themselves."""
    if upper:
        return column.contains(text.upper(), autoescape=True)
    return func.lower(column).contains(text.lower(), autoescape=True)


def in_date_range(column, filters: Filters) -> list:
    conditions = []
    if filters.since is not None:
        conditions.append(column >= filters.since)
    if filters.before is not None:
        conditions.append(column < filters.before)
    return conditions


def in_amount_range(amount_column, currency_column, filters: Filters) -> list:
    """Amounts are stored in each currency's minor unit, so "18.00" is 1800 for dollars, and an
    amount typed for a zero-decimal currency ("1500") is 1500 yen: one branch per kind of
    currency, each with its bounds in its own minor unit (a bound finer than the currency has,
    such as 18.005 dollars, is rounded inwards: an exact 18.005 matches nothing)."""
    low, high = filters.amount_min, filters.amount_max
    if low is None and high is None:
        return []
    code = func.lower(currency_column)
    kinds = (
        (0, code.in_(sorted(ZERO_DECIMAL))),
        (3, code.in_(sorted(THREE_DECIMAL))),
        (2, not_(code.in_(sorted(ZERO_DECIMAL | THREE_DECIMAL)))),
    )
    branches = []
    for digits, is_kind in kinds:
        scale = Decimal(10) ** digits
        bounds: list[ColumnElement[bool]] = [is_kind]
        lowest = math.ceil(low * scale) if low is not None else None
        # No amount column holds more than int4 (web.numbers): a bound past it is the column's
        # end, never a parameter PostgreSQL refuses.
        highest = min(math.floor(high * scale), INT4_MAX) if high is not None else None
        if lowest is not None and (lowest > INT4_MAX or highest is not None and lowest > highest):
            bounds.append(false())
            lowest = None
        if lowest is not None:
            bounds.append(amount_column >= lowest)
        if highest is not None:
            bounds.append(amount_column <= highest)
        branches.append(and_(*bounds))
    return [or_(*branches)]


def major_units(amount: int | None, currency: str | None) -> str:
    """An amount in the currency's own units, as typed into the filters ("18.00"): the CSV's
    money column, which a spreadsheet reads as a number."""
    if amount is None:
        return ""
    digits = minor_digits(currency or "")
    return f"{Decimal(int(amount)).scaleb(-digits):.{digits}f}"


def refused(filters: Filters, template: str, data: dict, **context):
    """The list's page (or JSON) for filters that could not be read: 400, the sentences beside the
    form with what was typed still in it, and no rows (none were looked for)."""
    return respond(
        template,
        {
            **data,
            "filters": {**data.get("filters", {}), **filters.as_json()},
            "error": " ".join(filters.errors),
            "errors": list(filters.errors),
            "status": 400,
        },
        400,
        error_field="filters",
        **context,
    )
