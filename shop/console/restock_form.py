"""The refund form's stock part: how many units of each line to put back (`restock_<line id>`,
default 0, at most what was bought less what earlier refunds put back), or, from a script,
`restock=yes` for every unit not yet back (docs/REFERENCE.md, *Refunding a paid order*)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..saga.line_restock import LineLeft, lines_left

UNITS = re.compile(r"[0-9]{1,6}")  # ASCII digits: \d takes every script's (web.numbers)
YES = ("yes", "y", "1", "on", "true")


def field(line_id: int) -> str:
    return f"restock_{line_id}"


def asked_lines(values: Mapping[str, str], order_id: int) -> tuple[list[LineLeft], dict[int, int], str | None]:
    """(the order's lines, {line id: units asked}, what is wrong in words or None). Without any
    line's field, `restock=yes` asks for every unit not yet back."""
    lines = lines_left(order_id)
    if not any(field(line.id) in values for line in lines) and (values.get("restock") or "").lower() in YES:
        return lines, {line.id: line.left for line in lines if line.left > 0}, None
    wanted: dict[int, int] = {}
    for line in lines:
        text = (values.get(field(line.id)) or "").strip()
        if not text:
            continue
        if not UNITS.fullmatch(text):
            return lines, wanted, f"The units of {line.sku} to put back must be a whole number from 0 ({text[:20]!r})."
        units = int(text)
        if units > line.left:
            return (
                lines,
                wanted,
                (
                    f"At most {line.left} × {line.sku} can go back: "
                    f"{line.quantity} bought, {line.restocked} back already."
                ),
            )
        if units:
            wanted[line.id] = units
    return lines, wanted, None


def asked_words(lines: list[LineLeft], wanted: Mapping[int, int]) -> str:
    """ "1 × SOCK-M, 2 × MUG-350" for the confirmation step; empty when nothing goes back."""
    return ", ".join(f"{wanted[line.id]} × {line.sku}" for line in lines if wanted.get(line.id))
