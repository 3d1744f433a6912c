"""A throwaway database for one benchmark run: a fresh PostgreSQL database on the server that
`url` names (dropped afterwards), or a SQLite file in a temp folder."""

from __future__ import annotations

import tempfile
import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


def make_database(url: str, label: str = "bench"):
    if url.startswith("sqlite"):
        folder = tempfile.mkdtemp(prefix=f"backstop-{label}-")
        return f"sqlite:///{folder}/bench.sqlite3", (lambda: None)
    server = make_url(url)
    name = f"backstop_{label}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop():
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return server.set(database=name).render_as_string(hide_password=False), drop


def seed_bench_variant(stock: int) -> int:
    """One product with one variant ("BENCH-1") holding `stock`, committed; returns the variant
    id. Call inside the bench's app context (the shop is imported late: its settings come from
    the environment the bench sets first)."""
    from shop.extensions import db
    from shop.models import InventoryItem, Product, Variant

    product = Product(slug="bench", name="Bench", description="")
    db.session.add(product)
    db.session.flush()
    variant = Variant(product_id=product.id, sku="BENCH-1", name="one", price=100, currency="usd")
    db.session.add(variant)
    db.session.flush()
    db.session.add(InventoryItem(variant_id=variant.id, on_hand=stock))
    db.session.commit()
    return variant.id


def move_deadline(order_id: int, command_id: int, due, window) -> None:
    """Make an order's payment deadline fall at `due`: its last change moved back by the window,
    and its deadline row due then (uncommitted: the caller commits a batch)."""
    from sqlalchemy import update

    from shop.extensions import db
    from shop.models import Order, ScheduledCommand

    db.session.execute(
        update(Order)
        .where(Order.id == order_id)
        .values(created_at=due - window, updated_at=due - window)
        .execution_options(synchronize_session=False)
    )
    db.session.execute(
        update(ScheduledCommand)
        .where(ScheduledCommand.id == command_id)
        .values(next_attempt_at=due)
        .execution_options(synchronize_session=False)
    )


def place_bench_order(variant_id: int, browser: str) -> int:
    """One real order of one unit, through the checkout use case, from its own browser's cart;
    returns the order id."""
    from sqlalchemy import insert

    from shop.extensions import db
    from shop.models import Cart, CartItem
    from shop.orders.checkout import place_order

    cart = Cart(browser_id=browser, status="open")
    db.session.add(cart)
    db.session.flush()
    db.session.execute(insert(CartItem).values(cart_id=cart.id, variant_id=variant_id, quantity=1))
    cart_id = cart.id
    db.session.commit()
    placed = place_order(cart_id=cart_id, browser_id=browser, email=f"bench-{browser[:12]}@example.com")
    assert placed.ok, placed
    return placed.order_id
