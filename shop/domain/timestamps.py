"""How the shop writes an instant for the outside (JSON, the console's pages): ISO 8601 in UTC."""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None
