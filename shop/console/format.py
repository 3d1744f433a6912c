"""Words for a tired operator: "12 min" rather than 720, "$18.00" rather than 1800 (money as the payment page
shows it: shop.money.format_money)."""

from __future__ import annotations

from datetime import datetime

from ..money import format_money


def human_age(seconds: float | int | None) -> str:
    if seconds is None:
        return "–"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def human_money(amount: int | None, currency: str | None) -> str:
    return format_money(amount, currency)


def human_time(value: str | datetime | None) -> str:
    """An ISO timestamp (as in the JSON) shown as `2026-11-30 14:05:09 UTC`."""
    if not value:
        return "–"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")
