"""An operator's correction of the address an order's emails go to (docs/REFERENCE.md, Console:
POST /console/orders/<ref>/email). The order's later emails go to the new one: each is rendered
and addressed when it is sent."""

from __future__ import annotations

from dataclasses import dataclass

from ..outbox import uow
from ..store import order_store


@dataclass
class EmailChange:
    old: str | None  # None: no such order
    new: str


def change_email(order_id: int, new: str) -> EmailChange:
    """Replace the order's address with `new` (checked by the caller's form, as the checkout's) in
    one transaction."""
    with uow.transaction():
        old = order_store.change_email(order_id, new)
    return EmailChange(old, new)
