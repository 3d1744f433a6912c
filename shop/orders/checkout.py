"""place_order: the one local transaction that turns a cart into an order.

Inside ONE transaction, in this order:
  0. FIRST, hold the customer's place: on PostgreSQL a transaction-scoped advisory lock on the
     browser, then one on the email address, then one on the client address the request came
     from (every checkout takes them in that order, in their own lock spaces, so they never wait
     on each other in a cycle; SQLite's BEGIN IMMEDIATE already serializes every writer), then
     count the live unpaid orders of each and refuse at UNPAID_ORDERS_PER_CLIENT (browser, email)
     or UNPAID_ORDERS_PER_ADDRESS (client address: a fresh cookie and a fresh email per checkout
     still come from one address). Counting after the locks is what keeps concurrent checkouts
     from one browser, or of one address from many browsers, from all seeing room for one more;
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

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from flask import current_app
from sqlalchemy import bindparam, func, select, text, update

from .. import failpoints
from ..domain.deadlines import utcnow
from ..domain.events import OrderPlaced
from ..domain.order import LIVE_STATUSES, OrderStatus
from ..extensions import db
from ..models import Cart, CartItem, CartState, CommandKind, InventoryItem, Order, Product, Variant
from ..outbox import schedule_command, write_events
from ..outbox.tables import rows_matched, table_of
from ..outbox.uow import transaction
from ..store import order_store
from .deadline import unpaid_hold

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
    ships: bool = False  # it holds physical goods: its payment page asks where to send them
    ok = True


class Refusal(StrEnum):
    EMPTY_CART = "empty_cart"
    OUT_OF_STOCK = "out_of_stock"
    UNAVAILABLE = "unavailable"  # an item is no longer for sale
    MIXED_CURRENCY = "mixed_currency"
    CART_CLOSED = "cart_closed"  # another checkout of this cart committed first
    TOO_MANY_OF_ONE = "too_many_of_one"  # a line holds more than MAX_LINE_QUANTITY
    TOO_MANY_UNPAID = "too_many_unpaid"  # the browser, the email or the client address is at its limit


class HeldBy(StrEnum):
    """Whose live unpaid orders reached UNPAID_ORDERS_PER_CLIENT: this browser's (it can see them
    on "Your orders"), or, when the browser has room, the email address's (placed elsewhere: this
    browser is never shown them)."""

    BROWSER = "browser"
    ADDRESS = "address"
    # The client address the checkout came from (request.remote_addr) holds
    # UNPAID_ORDERS_PER_ADDRESS live orders, whatever their browsers and emails.
    CLIENT_ADDRESS = "client_address"


@dataclass
class CheckoutRefused:
    """Why the cart did not become an order, as a code (the storefront says it in words,
    storefront/cart_words.py) and, for OUT_OF_STOCK and UNAVAILABLE, the lines at fault; for
    TOO_MANY_OF_ONE the lines over the limit (`over`) and for both TOO_MANY_ codes the `limit`;
    for TOO_MANY_UNPAID whose orders filled it (`held_by`)."""

    code: Refusal
    shortages: list[dict] = field(default_factory=list)
    over: list[dict] = field(default_factory=list)
    limit: int = 0
    held_by: HeldBy | None = None
    ok = False


class _Shortfall(Exception):
    """A line's stock ran short: raised inside the transaction so all of the checkout rolls back."""


class _CartClosed(Exception):
    """Another checkout of this cart committed first."""


class _TooManyUnpaid(Exception):
    """The browser, the email or the client address already holds its limit of live orders."""

    def __init__(self, held_by: HeldBy, limit: int):
        super().__init__(held_by)
        self.held_by, self.limit = held_by, limit


# The statements, built once with bound parameters and executed on the tables: building a
# statement, or sending an INSERT of a mapped class through the ORM's bulk machinery, cost more
# CPU than running its cached compiled form (checkout is the shop's hottest write).
_carts, _inventory = table_of(Cart), table_of(InventoryItem)

# The cart's lines with their current prices, in the order the stock will be taken. An outer
# join: a line whose variant row is gone still shows up, and is refused as unavailable.
_items, _variants, _products = table_of(CartItem), table_of(Variant), table_of(Product)
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
        _products.c.ships,
        _inventory.c.on_hand,
    )
    .select_from(
        _items.outerjoin(_variants, _variants.c.id == _items.c.variant_id)
        .outerjoin(_products, _products.c.id == _variants.c.product_id)
        .outerjoin(_inventory, (_inventory.c.variant_id == _items.c.variant_id) & _inventory.c.deleted_at.is_(None))
    )
    .where(_items.c.cart_id == bindparam("cart_id"))
    .order_by(_items.c.variant_id)
)
_CLOSE_CART = (
    update(_carts)
    .where(
        _carts.c.id == bindparam("cart_id"),
        _carts.c.browser_id == bindparam("browser"),
        _carts.c.status == CartState.OPEN,
    )
    .values(status=CartState.ORDERED, order_id=bindparam("order"))
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


# The live unpaid orders (docs/REFERENCE.md, Order states: every state that is neither Paid nor
# Cancelled, PaymentInitiated included: its stock is held too) of one browser and of one address,
# in one round trip. The address is compared lower-cased, which the console's ix_orders_email_lower
# index serves; the browser has its own index (orders.browser_id).
# A read through the mapped class: the orders table itself is written by the order store only.
_LIVE_OF_CLIENT = select(
    select(func.count())
    .select_from(Order)
    .where(Order.browser_id == bindparam("browser"), Order.status.in_(LIVE_STATUSES))
    .scalar_subquery(),
    select(func.count())
    .select_from(Order)
    .where(func.lower(Order.email) == bindparam("email"), Order.status.in_(LIVE_STATUSES))
    .scalar_subquery(),
    select(func.count())
    .select_from(Order)
    .where(Order.client_address == bindparam("client"), Order.status.in_(LIVE_STATUSES))
    .scalar_subquery(),
)
# Transaction-scoped (released by COMMIT or ROLLBACK, so PgBouncer's transaction pooling keeps
# nothing between transactions), one lock space for browsers and one for addresses, both taken by
# one statement and so in the same order by every checkout.
_LOCK_CLIENT = text(
    "SELECT pg_advisory_xact_lock(:browser_space, :browser), pg_advisory_xact_lock(:email_space, :email)"
)
# The same, and the client address last (a checkout with no client address, as a use case run
# outside a request, takes only the first two).
_LOCK_CLIENT_AT = text(
    "SELECT pg_advisory_xact_lock(:browser_space, :browser), pg_advisory_xact_lock(:email_space, :email), "
    "pg_advisory_xact_lock(:client_space, :client)"
)
_BROWSER_LOCKS, _EMAIL_LOCKS, _CLIENT_LOCKS = 0x42534B01, 0x42534B02, 0x42534B03  # "BSK" + 1..3: no other uses these


def _lock_key(value: str) -> int:
    """A stable signed 32-bit key for an advisory lock (the same in every process, unlike hash()).
    Two customers whose keys collide only wait for each other's checkout, never miscount."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=4).digest(), "big", signed=True)


def normalized_email(email: str) -> str:
    """The address as the unpaid-order limit counts it: one customer, whatever the case or spaces."""
    return email.strip().lower()


def _hold_client_slot(session, browser_id: str, email: str, client: str | None) -> None:
    """Step 0 (see the module's docstring): lock this browser, this email and this client address
    for the rest of the transaction, then raise _TooManyUnpaid if one already holds its limit of
    live orders. Under READ COMMITTED the count, run after the locks, sees every order committed
    by the checkouts that held them before."""
    address = normalized_email(email)
    if session.get_bind().dialect.name == "postgresql":
        keys = dict(browser_space=_BROWSER_LOCKS, browser=_lock_key(browser_id))
        keys.update(email_space=_EMAIL_LOCKS, email=_lock_key(address))
        if client is None:
            session.execute(_LOCK_CLIENT, keys)
        else:
            session.execute(_LOCK_CLIENT_AT, dict(keys, client_space=_CLIENT_LOCKS, client=_lock_key(client)))
    counts = session.execute(_LIVE_OF_CLIENT, dict(browser=browser_id, email=address, client=client)).one()
    cfg = current_app.config
    per_client, per_address = cfg["UNPAID_ORDERS_PER_CLIENT"], cfg["UNPAID_ORDERS_PER_ADDRESS"]
    limits = (per_client, per_client, per_address)
    whose = (HeldBy.BROWSER, HeldBy.ADDRESS, HeldBy.CLIENT_ADDRESS)
    for held, limit, held_by in zip(counts, limits, whose, strict=True):
        if held >= limit:
            raise _TooManyUnpaid(held_by, limit)


def place_order(
    *,
    cart_id: int,
    browser_id: str,
    email: str,
    now: datetime | None = None,
    in_line: bool = False,
    client_address: str | None = None,
) -> Placed | CheckoutRefused:
    """The checkout transaction (see the module's docstring). `in_line`: the order joins the line
    for its payment page in this same transaction (the caller knows the provider's budget for
    new sessions is spent), instead of a second one after a refused provider call.
    `client_address`: the address the request came from, counted against UNPAID_ORDERS_PER_ADDRESS."""
    now = now or utcnow()
    session = db.session
    rows = session.execute(_READ_CART, {"cart_id": cart_id}).all()
    lines = [(r.variant_id, r.quantity) for r in rows]
    variants = {r.variant_id: r for r in rows if r.known is not None}
    refused = _refuse_cart(rows, lines, variants, current_app.config["MAX_LINE_QUANTITY"])
    if refused is not None:
        session.rollback()
        return refused
    currency = rows[0].currency
    total = sum(variants[v].price * q for v, q in lines)
    # Physical goods anywhere in the cart: the payment page collects a shipping address.
    ships = any(bool(variants[v].ships) for v, _ in lines)
    reference, token = new_reference(), secrets.token_urlsafe(24)
    line_rows = [
        dict(variant_id=v, sku=variants[v].sku, name=variants[v].name, quantity=q, unit_price=variants[v].price)
        for v, q in lines
    ]
    try:
        with transaction():
            _hold_client_slot(session, browser_id, email, client_address)
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
                ships=ships,
                client_address=client_address,
            )
            closed = session.execute(_CLOSE_CART, dict(cart_id=cart_id, browser=browser_id, order=order_id))
            if rows_matched(closed) != 1:
                raise _CartClosed()
            write_events(session, [OrderPlaced(order_id, reference, total, currency)], now=now)
            _arm_deadline(session, order_id, now)
            _take_stock(session, lines, now)
    except _CartClosed:
        return CheckoutRefused(Refusal.CART_CLOSED)
    except _TooManyUnpaid as full:
        return CheckoutRefused(Refusal.TOO_MANY_UNPAID, limit=full.limit, held_by=full.held_by)
    except _Shortfall:
        return CheckoutRefused(Refusal.OUT_OF_STOCK, shortages(lines, variants))
    return Placed(order_id, reference, token, email, total, currency, line_rows, now, ships)


def _refuse_cart(rows, lines, variants, most_of_one: int) -> CheckoutRefused | None:
    """Why this cart cannot become an order, read before any write: empty, a variant no longer
    sold, a line over MAX_LINE_QUANTITY (a cart filled before the limit was lowered, or not
    through the cart's own checks), or prices in more than one currency."""
    if not rows:
        return CheckoutRefused(Refusal.EMPTY_CART)
    gone = [v for v, _ in lines if v not in variants or variants[v].deleted_at is not None]
    if gone:
        return CheckoutRefused(Refusal.UNAVAILABLE, [{"variant_id": v, "available": 0} for v in gone])
    over = [
        {"variant_id": v, "sku": variants[v].sku, "name": variants[v].name, "requested": q}
        for v, q in lines
        if q > most_of_one
    ]
    if over:
        return CheckoutRefused(Refusal.TOO_MANY_OF_ONE, over=over, limit=most_of_one)
    if len({r.currency for r in rows}) != 1:
        return CheckoutRefused(Refusal.MIXED_CURRENCY)
    # Short as last committed: refused here, before any lock or write. A flash sale's buyers are
    # mostly told "sold out"; each costs this one read instead of a whole checkout (the client's
    # locks, the order, its events, its deadline) rolled back at the decrement, which stays what
    # guarantees no oversell.
    short = _shortage_rows(lines, variants, {r.variant_id: r.on_hand or 0 for r in rows})
    if short:
        return CheckoutRefused(Refusal.OUT_OF_STOCK, short)
    return None


def _arm_deadline(session, order_id: int, now: datetime) -> None:
    """The new order has no payment session yet: its deadline is the short hold
    (UNPAID_HOLD_WITHOUT_SESSION_SECONDS). When a session is made (now, or later by "Pay now" or
    the payment queue) the order's pay-by becomes the session's expires_at, and this deadline,
    finding the order at the provider, waits for that instead (cancel._expire_at_the_provider)."""
    if current_app.config["UNPAID_ORDER_EXPIRY_ENABLED"]:
        due = now + timedelta(seconds=unpaid_hold(OrderStatus.PENDING_PAYMENT))
        schedule_command(session, CommandKind.EXPIRE_UNPAID_ORDER, due, order_id=order_id, now=now)


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
    return _shortage_rows(lines, variants, on_hand)


def _shortage_rows(lines, variants, on_hand: dict) -> list[dict]:
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
