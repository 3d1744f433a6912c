from sqlalchemy import Boolean, CheckConstraint, ForeignKey, Integer, String, Text, true
from sqlalchemy.orm import Mapped, mapped_column, relationship

from ..extensions import Model
from .types import UTCDateTime, now_utc


class Product(Model):
    __tablename__ = "products"
    id: Mapped[int] = mapped_column(primary_key=True)
    slug: Mapped[str] = mapped_column(String(80), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    # Physical goods the shop ships (the default, and every demo product): an order holding one
    # asks for a shipping address at the payment page. False for a digital product, which has
    # nothing to send.
    ships: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True, server_default=true())
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    variants = relationship("Variant", back_populates="product", order_by="Variant.id")


class Variant(Model):
    __tablename__ = "variants"
    id: Mapped[int] = mapped_column(primary_key=True)
    product_id: Mapped[int] = mapped_column(ForeignKey("products.id"), index=True)
    sku: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    price: Mapped[int] = mapped_column(Integer)  # minor units
    currency: Mapped[str] = mapped_column(String(3))
    deleted_at = mapped_column(UTCDateTime, nullable=True)
    product = relationship("Product", back_populates="variants")
    inventory = relationship("InventoryItem", uselist=False, back_populates="variant")

    __table_args__ = (CheckConstraint("price >= 0", name="price_not_negative"),)


class InventoryItem(Model):
    """Stock on hand for one variant. Soft-deleted rows stay: a cancelled order's stock still
    belongs to them. The CHECK is the last line of defence against overselling."""

    __tablename__ = "inventory"
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"), primary_key=True, autoincrement=False)
    on_hand: Mapped[int] = mapped_column(Integer, nullable=False)
    deleted_at = mapped_column(UTCDateTime, nullable=True)
    updated_at = mapped_column(UTCDateTime, default=now_utc, onupdate=now_utc, nullable=False)
    variant = relationship("Variant", back_populates="inventory")

    __table_args__ = (CheckConstraint("on_hand >= 0", name="on_hand_not_negative"),)
