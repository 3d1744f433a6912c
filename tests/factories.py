"""The one place tests build the rows they start from: catalog rows, carts, and orders placed
through the real checkout use case (place_order), never inserted by hand, so every order a test
sees went through the same rules a customer's does.

Unless a builder takes the app, call it inside an app context (it uses db.session). Orders placed
through the storefront over HTTP are the browser driver's (payment_helpers.Shopper)."""

from __future__ import annotations

import uuid
from typing import Iterable, Mapping

from sqlalchemy import select, update

from shop.domain.deadlines import utcnow
from shop.domain.order import Transition
from shop.extensions import db
from shop.models import Cart, CartItem, InventoryItem, Order, Product, Variant
from shop.orders.checkout import Placed, place_order
from shop.outbox import uow
from shop.seed import seed_catalog
from shop.store import order_store as order_store

DEFAULT_SKU = "NB-A5-DOT"  # 40 in stock after seeding: enough for any one test
Items = Mapping[int | str, int] | Iterable[tuple[int | str, int]]


# -- catalog rows ------------------------------------------------------------------------------


def seed_catalog_rows(app=None, currency: str = "usd") -> dict[str, int]:
    """The demo catalog of shop.seed (idempotent) priced in `currency`, committed; returns sku ->
    variant id. Given the app, in an app context of its own; without, in the current one."""
    if app is not None:
        with app.app_context():
            skus = seed_catalog_rows(currency=currency)
            db.session.remove()
            return skus
    seed_catalog(currency)
    skus = {v.sku: v.id for v in db.session.execute(select(Variant)).scalars()}
    db.session.rollback()
    return skus


def on_hand(variant: int | str, app=None) -> int:
    """A variant's stock as committed, by its id or sku: the tests' one stock reader. With `app`,
    in a context of its own (its session removed after); without, in the current one, read fresh
    and its transaction ended, so the read never holds a snapshot another writer's commit would miss."""
    if app is not None:
        with app.app_context():
            try:
                return on_hand(variant)
            finally:
                db.session.remove()
    db.session.expire_all()
    vid = variant_id(variant) if isinstance(variant, str) else variant
    value = db.session.execute(select(InventoryItem.on_hand).where(InventoryItem.variant_id == vid)).scalar_one()
    db.session.rollback()
    return value


def catalog_rows(*stocks: int, price: int = 500) -> list[int]:
    """A new product with one variant per stock figure (prices price, price+1, ...), committed;
    returns the variant ids, ascending."""
    product = Product(slug=f"p-{uuid.uuid4().hex[:10]}", name="Product", description="")
    db.session.add(product)
    db.session.flush()
    product.name = f"Product {product.id}"  # by its id, so a test's expected names do not hang on test order
    ids = []
    for i, stock in enumerate(stocks):
        variant = Variant(
            product_id=product.id, sku=f"SKU-{uuid.uuid4().hex[:8]}-{i}", name=f"V{i}", price=price + i, currency="usd"
        )
        db.session.add(variant)
        db.session.flush()
        db.session.add(InventoryItem(variant_id=variant.id, on_hand=stock))
        ids.append(variant.id)
    db.session.commit()
    return ids


def variant_id(sku: str) -> int:
    """The id of a seeded variant."""
    return db.session.execute(select(Variant.id).where(Variant.sku == sku)).scalar_one()


# -- carts and orders --------------------------------------------------------------------------


def cart_with(items: Items, browser: str | None = None) -> tuple[int, str]:
    """An open cart (of a fresh browser unless one is named) holding `items`, {variant id or sku:
    quantity} or (variant id or sku, quantity) pairs, inserted in the order given (so their ids
    follow it); committed. Returns (cart id, browser id)."""
    pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
    browser = browser or uuid.uuid4().hex
    cart = Cart(browser_id=browser, status="open")
    db.session.add(cart)
    db.session.flush()
    for variant, quantity in pairs:
        vid = variant_id(variant) if isinstance(variant, str) else variant
        db.session.add(CartItem(cart_id=cart.id, variant_id=vid, quantity=quantity))
        db.session.flush()
    db.session.commit()
    return cart.id, browser


def place_order_for(
    items: Items | None = None, *, email: str | None = None, now=None, browser: str | None = None
) -> Placed:
    """A real order through place_order from a cart holding `items` (see cart_with; one
    DEFAULT_SKU by default), placed at `now`; asserts it was placed and returns the use case's
    Placed (order_id, reference, total, ...). The catalog must be seeded. Unless named, the
    browser is a fresh one and the address is that browser's own (`ann.<browser>@example.com`):
    each such order is another customer's, so UNPAID_ORDERS_PER_CLIENT never refuses it."""
    cart_id, browser = cart_with({DEFAULT_SKU: 1} if items is None else items, browser)
    email = email or f"ann.{browser[:16]}@example.com"
    placed = place_order(cart_id=cart_id, browser_id=browser, email=email, now=now)
    assert placed.ok, placed
    return placed


def placed_order_in(app, sku: str = "MUG-350-SND", quantity: int = 1, now=None) -> tuple[int, str]:
    """In an app context of its own: the demo catalog, then one order of `quantity` x `sku` from
    the browser "browser-1" placed at `now`. Returns (order id, reference)."""
    with app.app_context():
        seed_catalog_rows()
        placed = place_order_for({sku: quantity}, now=now, browser="browser-1", email="ann@example.com")
        return placed.order_id, placed.reference


def transitioned(order_id: int, *steps: tuple[Transition, callable], allowed_only: bool = True):
    """The order after `steps`, each saved the way the use cases save a transition: read from the
    order store, changed by the domain's rule (`act(order)`), saved with its events in one unit of
    work. For a test that needs an order in a state without the provider the use case would ask.
    A step the rules refuse fails the test, or (allowed_only=False) writes nothing. Returns the
    store's order after the last step."""
    for transition, act in steps:
        with uow.transaction():
            order = order_store.read(order_id, fresh=True)
            result = act(order)
            assert result.ok or not allowed_only, result
            if result.ok:
                order_store.save(order, transition, result.events, now=utcnow())
    return order


def force_order(order: int | str | None, *, elsewhere: bool = False, **values) -> None:
    """The tests' one hand on an order's row outside the order store: set columns the way time,
    another writer or a bug would have left them (an older `updated_at`, a bumped `version`, a
    changed `total`), and commit. `order` is an id or a reference; None forces every order.
    Values may be SQL expressions (`version=Order.version + 1`). `elsewhere`: on a connection of
    its own, as another process would, leaving the session's transaction as it is."""
    statement = update(Order).values(**values).execution_options(synchronize_session=False)
    if isinstance(order, int):
        statement = statement.where(Order.id == order)
    elif order is not None:
        statement = statement.where(Order.reference == order)
    if elsewhere:
        with db.engine.begin() as other:
            other.execute(statement)
        return
    db.session.execute(statement)
    db.session.commit()
