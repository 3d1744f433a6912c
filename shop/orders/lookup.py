"""Finding an order by a reference that came from outside (a URL, a form, a provider's event)."""
from __future__ import annotations

import re

from sqlalchemy import select

from ..extensions import db
from ..models import Order

# Wider than what new_reference() makes, so an order created any other way is still found; narrow
# enough that text which cannot be a reference never reaches the database (PostgreSQL answers a
# NUL byte in a text parameter with an error, which would turn a typo into a 500).
_REFERENCE = re.compile(r"[A-Za-z0-9_-]{1,20}")


def order_by_reference(reference: str | None) -> Order | None:
    if not reference or not _REFERENCE.fullmatch(reference):
        return None
    return db.session.execute(select(Order).where(Order.reference == reference)).scalar_one_or_none()
