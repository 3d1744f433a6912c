"""A number typed into a form, as the shop reads it: ASCII digits (an optional sign), within the
range its column holds, or nothing (docs/REFERENCE.md, Console). Python's int() and re's \\d take
digits of every script ("١٢", "1༤2") and str.isdigit() takes "²", which int() refuses: a number
read through them could reach the database as one nobody typed, or past PostgreSQL's int4 and a 500."""

from __future__ import annotations

import re

INT4_MAX = 2_147_483_647  # PostgreSQL's integer, the type of every count and figure a form writes
# A sign and at most 12 ASCII digits: anything longer is out of every range below anyway, and
# int() of a long string costs quadratic time.
_WHOLE = re.compile(r"[+-]?[0-9]{1,12}")


def whole_number(text: str | None, low: int = 0, high: int = INT4_MAX) -> int | None:
    """`text` (spaces around it aside) as a whole number from `low` to `high`; None when it is
    not one (empty, another script's digits, a point, an exponent, out of range)."""
    text = (text or "").strip()
    if not _WHOLE.fullmatch(text):
        return None
    value = int(text)
    return value if low <= value <= high else None
