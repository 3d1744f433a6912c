"""The demo catalog. Idempotent: products and variants are matched by slug / sku."""

from __future__ import annotations

from sqlalchemy import select
from werkzeug.security import generate_password_hash

from .extensions import db
from .models import InventoryItem, Operator, Product, Variant

DEMO = [
    (
        "field-notebook",
        "Field Notebook",
        "Dot-grid, lay-flat, 96 pages of 100 g paper.",
        [
            ("NB-A5-DOT", "A5, dot grid", 1400, 40),
            ("NB-A6-DOT", "A6, dot grid", 1100, 25),
        ],
    ),
    (
        "enamel-mug",
        "Enamel Camp Mug",
        "Steel with a glass-hard enamel coat; 350 ml.",
        [
            ("MUG-350-SND", "Sand", 1800, 12),
            ("MUG-350-NVY", "Navy", 1800, 3),
        ],
    ),
    (
        "wool-socks",
        "Merino Hiking Socks",
        "Cushioned merino blend for long days.",
        [
            ("SOCK-M", "Size M", 2200, 30),
            ("SOCK-L", "Size L", 2200, 0),
        ],
    ),
]


def seed_catalog(currency: str = "usd") -> dict:
    created = {"products": 0, "variants": 0}
    for slug, name, description, variants in DEMO:
        product = db.session.execute(select(Product).where(Product.slug == slug)).scalar_one_or_none()
        if product is None:
            product = Product(slug=slug, name=name, description=description)
            db.session.add(product)
            db.session.flush()
            created["products"] += 1
        for sku, vname, price, stock in variants:
            variant = db.session.execute(select(Variant).where(Variant.sku == sku)).scalar_one_or_none()
            if variant is None:
                variant = Variant(product_id=product.id, sku=sku, name=vname, price=price, currency=currency)
                db.session.add(variant)
                db.session.flush()
                db.session.add(InventoryItem(variant_id=variant.id, on_hand=stock))
                created["variants"] += 1
    db.session.commit()
    return created


def upsert_operator(email: str, password: str) -> bool:
    """Create or reset an operator. Returns True when created."""
    email = email.strip().lower()
    op = db.session.execute(select(Operator).where(Operator.email == email)).scalar_one_or_none()
    created = op is None
    if created:
        op = Operator(email=email, password_hash="")
        db.session.add(op)
    if created:
        op.password_hash = generate_password_hash(password)
    else:
        op.set_password(generate_password_hash(password))  # a reset ends every session of the old password
    db.session.commit()
    return created


def create_operator_if_missing(email: str, password: str) -> bool:
    """Create the operator unless one exists; an existing password is never touched (a demo's
    restart keeps the login its user wrote down). Returns True when created."""
    email = email.strip().lower()
    if db.session.execute(select(Operator.id).where(Operator.email == email)).first() is not None:
        db.session.rollback()
        return False
    db.session.add(Operator(email=email, password_hash=generate_password_hash(password)))
    db.session.commit()
    return True
