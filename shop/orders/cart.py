"""The cart's use cases: add an item, set a line's quantity, remove a line. A cart holds no stock:
the stock check here only warns early (checkout decides, with its conditional decrements), so
these write only `carts` and `cart_items` and commit through the one commit path with no event.

Each answers a `CartChange`, a code and the facts behind it: the storefront says it in words
(storefront/cart_words.py) on the page or JSON of docs/REFERENCE.md, Storefront, and writes
nothing itself."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from flask import current_app
from sqlalchemy import insert, select
from sqlalchemy.orm import joinedload

from ..extensions import db
from ..models import Cart, CartItem, CartState, Variant
from ..outbox import uow
from ..outbox.tables import table_of


def most_of_one_item() -> int:
    """Units of one item a cart line may hold: MAX_LINE_QUANTITY (docs/REFERENCE.md, Settings), so
    that a few carts cannot hold the whole stock of an item through the payment window."""
    return current_app.config["MAX_LINE_QUANTITY"]


class CartChangeOutcome(StrEnum):
    """What a cart change came to (CartChange.outcome); the cart's own state is models.CartState."""

    DONE = "done"
    NOT_FOR_SALE = "not_for_sale"
    NOT_IN_CART = "not_in_cart"
    SHORT = "short"  # fewer on hand than the line would hold
    TOO_MANY = "too_many"  # more than MAX_LINE_QUANTITY of one item


@dataclass(frozen=True)
class CartChange:
    """What a cart use case did, as a code and its facts: `item` the customer's name for the item
    (item_name; "" when there is none), `quantity` how many an add put in, `wanted` how many the
    line would hold and `available` how many are on hand (SHORT; 0 is sold out), `limit` the most a
    line may hold (TOO_MANY)."""

    outcome: CartChangeOutcome
    item: str = ""
    quantity: int = 0
    wanted: int = 0
    available: int = 0
    limit: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome is CartChangeOutcome.DONE


def item_name(variant: Variant) -> str:
    """What a customer calls it: the product and the variant ("Enamel Camp Mug – Navy"), not the SKU."""
    return f"{variant.product.name} – {variant.name}"


# What an add reads of the item: the variant with its product (the item's name) and its stock row
# (the early warning), in one statement instead of three.
_NAMED_WITH_STOCK = (joinedload(Variant.product), joinedload(Variant.inventory))


def variant_to_add(variant_id: int) -> Variant | None:
    """The variant `variant_id` as add_item reads it (its product and stock row with it), or None."""
    return db.session.get(Variant, variant_id, options=_NAMED_WITH_STOCK)


def open_cart(browser: str | None) -> Cart | None:
    """This browser's open cart, or None."""
    if browser is None:
        return None
    return db.session.execute(
        select(Cart).where(Cart.browser_id == browser, Cart.status == CartState.OPEN).order_by(Cart.id.desc()).limit(1)
    ).scalar_one_or_none()


_carts, _cart_items = table_of(Cart), table_of(CartItem)
# A new cart with its first line: two plain INSERTs (the ORM's flush of two new objects cost more
# CPU than the statements themselves, on every new customer's first add).
_OPEN_CART = insert(_carts).returning(_carts.c.id)
_FIRST_LINE = insert(_cart_items)


def _open_cart_with(browser: str, variant_id: int, quantity: int) -> None:
    """Open this browser's cart holding `quantity` of `variant_id` (in the caller's transaction)."""
    cart_id = db.session.execute(_OPEN_CART, dict(browser_id=browser, status=CartState.OPEN)).scalar_one()
    db.session.execute(_FIRST_LINE, dict(cart_id=cart_id, variant_id=variant_id, quantity=quantity))


def _line(cart: Cart, variant_id: int) -> CartItem | None:
    return db.session.execute(
        select(CartItem).where(CartItem.cart_id == cart.id, CartItem.variant_id == variant_id)
    ).scalar_one_or_none()


def _short_of_stock(variant: Variant | None, wanted: int) -> CartChange | None:
    """A refusal when fewer than `wanted` are on hand (a soft-deleted row holds none)."""
    inv = variant.inventory if variant is not None else None
    available = inv.on_hand if inv is not None and inv.deleted_at is None else 0
    if wanted <= available:
        return None
    name = item_name(variant) if variant is not None else ""
    return CartChange(CartChangeOutcome.SHORT, item=name, wanted=wanted, available=available)


def _too_many(variant: Variant | None, wanted: int) -> CartChange | None:
    """A refusal when a line would hold more than MAX_LINE_QUANTITY units. Checked before the
    stock: the limit is the customer's to respect whatever is on hand."""
    limit = most_of_one_item()
    if wanted <= limit:
        return None
    name = item_name(variant) if variant is not None else ""
    return CartChange(CartChangeOutcome.TOO_MANY, item=name, wanted=wanted, limit=limit)


def _refuse(change: CartChange) -> CartChange:
    db.session.rollback()  # nothing of a refused change stays, not even a cart created for it
    return change


def add_item(browser: str, variant: Variant | None, quantity: int, *, new_browser: bool = False) -> CartChange:
    """Add `quantity` of `variant` to the browser's cart (opening one), within the stock on hand
    and at most MAX_LINE_QUANTITY of one item. `new_browser`: the browser's id was made by this
    request (it has no cart yet). Read `variant` with variant_to_add: its name and stock come
    with it."""
    if variant is None or variant.deleted_at is not None:
        return _refuse(CartChange(CartChangeOutcome.NOT_FOR_SALE))
    name = item_name(variant)  # read now: the commit expires the variant (two more queries after it)
    try:
        with uow.transaction():  # a refusal raised inside writes nothing
            # A browser whose id this very request made has no cart to look for.
            cart = None if new_browser else open_cart(browser)
            item = None if cart is None else _line(cart, variant.id)
            wanted = quantity + (item.quantity if item else 0)
            short = _too_many(variant, wanted) or _short_of_stock(variant, wanted)
            if short is not None:
                raise _Refused(short)
            if item:
                item.quantity = wanted
            elif cart is not None:
                db.session.add(CartItem(cart_id=cart.id, variant_id=variant.id, quantity=wanted))
            else:
                _open_cart_with(browser, variant.id, wanted)
    except _Refused as refusal:
        return refusal.change
    return CartChange(CartChangeOutcome.DONE, item=name, quantity=quantity, wanted=wanted)


def set_quantity(browser: str | None, variant_id: int, quantity: int) -> CartChange:
    """Set one line's quantity, checked against MAX_LINE_QUANTITY and the stock like an add."""
    cart = open_cart(browser)
    item = None if cart is None else _line(cart, variant_id)
    if item is None:
        return _refuse(CartChange(CartChangeOutcome.NOT_IN_CART))
    variant = db.session.get(Variant, variant_id)
    short = _too_many(variant, quantity) or _short_of_stock(variant, quantity)
    if short is not None:
        return _refuse(short)
    with uow.transaction():
        item.quantity = quantity
    return CartChange(CartChangeOutcome.DONE)


def remove_item(browser: str | None, variant_id: int) -> CartChange:
    """Remove one line; removing what is not there changes nothing and is not an error."""
    cart = open_cart(browser)
    if cart is None:
        return CartChange(CartChangeOutcome.DONE)
    with uow.transaction():
        for item in cart.items:
            if item.variant_id == variant_id:
                db.session.delete(item)
    return CartChange(CartChangeOutcome.DONE)


class _Refused(Exception):
    """Leaves add_item's transaction with the refusal it rolled back for."""

    def __init__(self, change: CartChange):
        super().__init__(str(change.outcome))
        self.change = change
