"""How many order emails one recipient, and the orders of one client address, may cause in an
hour (docs/REFERENCE.md, Security): the order-placed email and the cancellation notice (cancelled
by the customer, or expired) are sent at most ORDER_EMAILS_PER_RECIPIENT times an hour to one
address and ORDER_EMAILS_PER_ADDRESS times an hour about orders from one client address. Anyone
may type anyone's email at checkout, and a place-then-cancel loop would otherwise make the shop a
free mailer aimed at it. The order itself is untouched; only its email is left out.

Counted from the orders themselves, no ledger: each order that was placed, or cancelled in a way
that emails, within the hour before this email's own event (placed: the order's created_at;
cancelled: its cancelled_at), before it, is one email that may have gone out. So a redelivered
event decides the same, and an email left out still counts (a cap, not a quota to refill).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import and_, bindparam, func, or_, select

from ..domain.deadlines import as_utc
from ..domain.order import CANCELLED_BY_CUSTOMER, PAYMENT_WINDOW_EXPIRED
from ..extensions import db
from ..models import Order

log = logging.getLogger("shop.saga")

WINDOW = timedelta(hours=1)
# The cancellations whose notice is emailed (saga.notifications.CANCELLATION_EMAILS).
_EMAILED_CANCEL = or_(
    Order.cancel_reason.like(CANCELLED_BY_CUSTOMER + "%"), Order.cancel_reason.like(PAYMENT_WINDOW_EXPIRED + "%")
)


# One prebuilt statement counts both caps' emails (its cache key is made once, not per email):
# orders placed, and orders cancelled in a way that emails, within the hour before `at` and
# before the order `order_id`'s own event at `at`, of one recipient and of one client address.
_SINCE = bindparam("since", type_=Order.created_at.type)
_AT = bindparam("at", type_=Order.created_at.type)
_ORDER_ID = bindparam("order_id", type_=Order.id.type)


def _before(column):
    return and_(column >= _SINCE, or_(column < _AT, and_(column == _AT, Order.id < _ORDER_ID)))


def _emails(whose):
    placed = select(func.count()).select_from(Order).where(whose, _before(Order.created_at))
    cancelled = select(func.count()).select_from(Order).where(whose, _EMAILED_CANCEL, _before(Order.cancelled_at))
    return placed.scalar_subquery() + cancelled.scalar_subquery()


_EMAILS_BEFORE = select(
    _emails(func.lower(Order.email) == bindparam("recipient", type_=Order.email.type)).label("recipient"),
    _emails(Order.client_address == bindparam("address", type_=Order.client_address.type)).label("address"),
)


def may_email(order: Order, at: datetime | None) -> bool:
    """Whether the email of `order`'s event at `at` (its placing or its cancellation) is within
    both caps; False is logged, with the order's reference and which cap."""
    if at is None:
        return True
    at, cfg = as_utc(at), current_app.config
    params = {
        "since": at - WINDOW,
        "at": at,
        "order_id": order.id,
        "recipient": order.email.strip().lower(),
        "address": order.client_address,
    }
    counts = db.session.execute(_EMAILS_BEFORE, params).one()
    caps = [("recipient", counts.recipient, cfg["ORDER_EMAILS_PER_RECIPIENT"])]
    if order.client_address:
        caps.append(("client address", counts.address, cfg["ORDER_EMAILS_PER_ADDRESS"]))
    for name, emails, cap in caps:
        if emails >= cap:
            log.warning("order %s: email left out, its %s had %d order emails this hour", order.reference, name, cap)
            return False
    return True
