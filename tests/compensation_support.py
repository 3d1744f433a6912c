"""Helpers shared by the outbox, compensation and worker-crash tests: real orders made through
the real use cases (seed, cart, place_order, cancel_order), and fresh reads of the rows."""
from __future__ import annotations

import uuid

from sqlalchemy import select

from shop.extensions import db
from shop.models import Cart, CartItem, InventoryItem, Order, OutboxDelivery, RestoreWarning, Variant
from shop.orders.checkout import place_order
from shop.orders.cancel import cancel_order
from shop.seed import seed_catalog


def seed() -> dict[str, int]:
    """The demo catalog; returns sku -> variant id."""
    seed_catalog()
    skus = {v.sku: v.id for v in db.session.execute(select(Variant)).scalars()}
    db.session.rollback()
    return skus


def place(items: dict[int, int], email: str = "ann@example.com", now=None) -> int:
    """Place an order for {variant_id: quantity} from a fresh browser's cart; returns its id."""
    browser = uuid.uuid4().hex
    cart = Cart(browser_id=browser, status="open")
    db.session.add(cart)
    db.session.flush()
    for variant_id, quantity in sorted(items.items()):
        db.session.add(CartItem(cart_id=cart.id, variant_id=variant_id, quantity=quantity))
    db.session.commit()
    placed = place_order(cart_id=cart.id, browser_id=browser, email=email, now=now)
    assert placed.ok, placed
    return placed.order_id


def cancel(order_id: int) -> None:
    """The customer's cancel of a PendingPayment order (no provider involved)."""
    version = db.session.get(Order, order_id).version
    outcome = cancel_order(order_id, version)
    assert outcome.status == "cancelled", outcome
    db.session.remove()


def placed_and_cancelled(items: dict[int, int]) -> tuple[int, int]:
    """An order that is cancelled, with its pending restore_inventory delivery: (order, delivery)."""
    order_id = place(items)
    cancel(order_id)
    return order_id, restore_delivery(order_id).id


def restore_delivery(order_id: int) -> OutboxDelivery:
    db.session.expire_all()
    return db.session.execute(
        select(OutboxDelivery).where(OutboxDelivery.order_id == order_id,
                                     OutboxDelivery.handler == "restore_inventory")).scalar_one()


def on_hand(variant_id: int) -> int:
    db.session.expire_all()
    value = db.session.execute(
        select(InventoryItem.on_hand).where(InventoryItem.variant_id == variant_id)).scalar_one()
    db.session.rollback()
    return value


def stock(variant_ids) -> dict[int, int]:
    return {v: on_hand(v) for v in variant_ids}


def order(order_id: int) -> Order:
    db.session.expire_all()
    return db.session.get(Order, order_id)


def warnings(order_id: int) -> list[RestoreWarning]:
    db.session.expire_all()
    return list(db.session.execute(
        select(RestoreWarning).where(RestoreWarning.order_id == order_id).order_by(RestoreWarning.id)).scalars())
