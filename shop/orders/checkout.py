"""place_order: the one local transaction that turns a cart into an order.

Inside ONE transaction, in this order:
  1. insert the order and its lines (the order store's `insert_order`), with prices read from
     the database (never from a form);
  2. close the cart with a conditional update (open -> ordered), so a double submit cannot
     turn one cart into two orders;
  3. write the OrderPlaced event to the outbox and arm the order's payment deadline (a
     scheduled command row): "there is an order" and "there is a deadline" are one fact;
  4. LAST, just before COMMIT, decrement each variant's stock with a conditional relative
     update (on_hand = on_hand - n WHERE on_hand >= n), in ascending variant id order.
Decrementing last keeps the hot stock-row locks for the shortest time (measured: more
throughput than decrementing first); the fixed order means two checkouts of the same variants
can never wait on each other in a cycle. Any shortfall rolls everything back.

Nothing touches Redis before the commit; the deadline is announced to rq-scheduler after it.
Core statements rather than ORM objects: Python CPU, not PostgreSQL, is the ceiling here.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from flask import current_app
from sqlalchemy import bindparam, select, update

from .. import failpoints
from ..domain.deadlines import utcnow
from ..domain.events import OrderPlaced
from ..extensions import db
from ..models import Product, Cart, CartItem, InventoryItem, Variant
from ..outbox import schedule_command, write_events
from ..outbox.uow import transaction
from ..store import order_store

_REF_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: references are read aloud


def new_reference() -> str:
    return "BK-" + "".join(secrets.choice(_REF_ALPHABET) for _ in range(8))


@dataclass
class Placed:
    order_id: int
    reference: str
    access_token: str
    # The order as committed (PendingPayment, version 1, no payment attempt yet), so the caller
    # can start its payment without reading it back.
    email: str = ""
    total: int = 0
    currency: str = ""
    lines: list[dict] = field(default_factory=list)
    placed_at: datetime | None = None
    ok = True


class Refusal(StrEnum):
    EMPTY_CART = "empty_cart"
    OUT_OF_STOCK = "out_of_stock"
    UNAVAILABLE = "unavailable"  # an item is no longer for sale
    MIXED_CURRENCY = "mixed_currency"
    CART_CLOSED = "cart_closed"  # another checkout of this cart committed first


@dataclass
class CheckoutRefused:
    """Why the cart did not become an order, as a code (the storefront says it in words,
    storefront/cart_words.py) and, for OUT_OF_STOCK and UNAVAILABLE, the lines at fault."""

    code: Refusal
    shortages: list[dict] = field(default_factory=list)
    ok = False


class _Shortfall(Exception):
    """A line's stock ran short: raised inside the transaction so all of the checkout rolls back."""


class _CartClosed(Exception):
    """Another checkout of this cart committed first."""


# The statements, built once with bound parameters and executed on the tables: building a
# statement, or sending an INSERT of a mapped class through the ORM's bulk machinery, cost more
# CPU than running its cached compiled form (checkout is the shop's hottest write).
_carts, _inventory = Cart.__table__, InventoryItem.__table__

# The cart's lines with their current prices, in the order the stock will be taken. An outer
# join: a line whose variant row is gone still shows up, and is refused as unavailable.
_items, _variants, _products = CartItem.__table__, Variant.__table__, Product.__table__
_READ_CART = (
    select(
        _items.c.variant_id,
        _items.c.quantity,
        _variants.c.id.label("known"),
        _variants.c.sku,
        (_products.c.name + " – " + _variants.c.name).label("name"),
        _variants.c.price,
        _variants.c.currency,
        _variants.c.deleted_at,
    )
    .select_from(
        _items.outerjoin(_variants, _variants.c.id == _items.c.variant_id).outerjoin(
            _products, _products.c.id == _variants.c.product_id
        )
    )
    .where(_items.c.cart_id == bindparam("cart_id"))
    .order_by(_items.c.variant_id)
)
_CLOSE_CART = (
    update(_carts)
    .where(_carts.c.id == bindparam("cart_id"), _carts.c.browser_id == bindparam("browser"), _carts.c.status == "open")
    .values(status="ordered", order_id=bindparam("order"))
)
_DECREMENT = (
    update(_inventory)
    .where(
        _inventory.c.variant_id == bindparam("variant"),
        _inventory.c.on_hand >= bindparam("quantity"),
        _inventory.c.deleted_at.is_(None),
    )
    .values(
        on_hand=_inventory.c.on_hand - bindparam("quantity"),
        updated_at=bindparam("now", type_=_inventory.c.updated_at.type),
    )
)


def place_order(
    *, cart_id: int, browser_id: str, email: str, now: datetime | None = None, in_line: bool = False
) -> Placed | CheckoutRefused:
    """The checkout transaction (see the module's docstring). `in_line`: the order joins the line
    for its payment page in this same transaction (the caller knows the provider's budget for
    new sessions is spent), instead of a second one after a refused provider call."""
    now = now or utcnow()
    session = db.session
    rows = session.execute(_READ_CART, {"cart_id": cart_id}).all()
    lines = [(r.variant_id, r.quantity) for r in rows]
    variants = {r.variant_id: r for r in rows if r.known is not None}
    refused = _refuse_cart(rows, lines, variants)
    if refused is not None:
        session.rollback()
        return refused
    currency = rows[0].currency
    total = sum(variants[v].price * q for v, q in lines)
    reference, token = new_reference(), secrets.token_urlsafe(24)
    line_rows = [
        dict(variant_id=v, sku=variants[v].sku, name=variants[v].name, quantity=q, unit_price=variants[v].price)
        for v, q in lines
    ]
    try:
        with transaction():
            order_id = order_store.insert_order(
                session,
                reference=reference,
                access_token=token,
                browser_id=browser_id,
                email=email,
                total=total,
                currency=currency,
                now=now,
                lines=line_rows,
                in_line=in_line,
            )
            closed = session.execute(_CLOSE_CART, dict(cart_id=cart_id, browser=browser_id, order=order_id))
            if closed.rowcount != 1:
                raise _CartClosed()
            write_events(session, [OrderPlaced(order_id, reference, total, currency)], now=now)
            _arm_deadline(session, order_id, now)
            _take_stock(session, lines, now)
    except _CartClosed:
        return CheckoutRefused(Refusal.CART_CLOSED)
    except _Shortfall:
        return CheckoutRefused(Refusal.OUT_OF_STOCK, shortages(lines, variants))
    return Placed(order_id, reference, token, email, total, currency, line_rows, now)


def _refuse_cart(rows, lines, variants) -> CheckoutRefused | None:
    """Why this cart cannot become an order, read before any write: empty, a variant no longer
    sold, or prices in more than one currency."""
    if not rows:
        return CheckoutRefused(Refusal.EMPTY_CART)
    gone = [v for v, _ in lines if v not in variants or variants[v].deleted_at is not None]
    if gone:
        return CheckoutRefused(Refusal.UNAVAILABLE, [{"variant_id": v, "available": 0} for v in gone])
    if len({r.currency for r in rows}) != 1:
        return CheckoutRefused(Refusal.MIXED_CURRENCY)
    return None


def _arm_deadline(session, order_id: int, now: datetime) -> None:
    cfg = current_app.config
    if cfg["UNPAID_ORDER_EXPIRY_ENABLED"]:
        schedule_command(
            session,
            "expire_unpaid_order",
            now + timedelta(seconds=cfg["UNPAID_ORDER_EXPIRY_SECONDS"]),
            order_id=order_id,
            now=now,
        )


def _take_stock(session, lines, now: datetime) -> None:
    """LAST before the commit: the conditional decrements, in ascending variant id (no lock-order
    cycles). A line short of stock raises _Shortfall, which rolls the whole checkout back."""
    for variant_id, quantity in lines:
        taken = session.execute(_DECREMENT, dict(variant=variant_id, quantity=quantity, now=now))
        if taken.rowcount != 1:
            raise _Shortfall()
        failpoints.hit("place_order.after_decrement")  # lets a test widen the lock window


def shortages(lines, variants) -> list[dict]:
    """After the rollback: which lines are short, and how many are left of each."""
    ids = [v for v, _ in lines]
    on_hand = dict(
        db.session.execute(
            select(InventoryItem.variant_id, InventoryItem.on_hand).where(
                InventoryItem.variant_id.in_(ids), InventoryItem.deleted_at.is_(None)
            )
        ).all()
    )
    db.session.rollback()
    return [
        {
            "variant_id": v,
            "sku": variants[v].sku,
            "name": variants[v].name,
            "requested": q,
            "available": on_hand.get(v, 0),
        }
        for v, q in lines
        if on_hand.get(v, 0) < q
    ]
