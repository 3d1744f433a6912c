from enum import StrEnum

from sqlalchemy import CheckConstraint, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from ..extensions import Model
from .types import UTCDateTime, now_utc


class CartState(StrEnum):
    """Where a cart is (`carts.status`): open to changes, or ordered (checkout closed it)."""

    OPEN = "open"
    ORDERED = "ordered"


class Cart(Model):
    """A browser's cart. Checkout closes it with a conditional update (status open -> ordered),
    so a double-submitted checkout cannot turn one cart into two orders."""

    __tablename__ = "carts"
    id: Mapped[int] = mapped_column(primary_key=True)
    browser_id: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16), default=CartState.OPEN.value)
    order_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False)
    items = relationship("CartItem", order_by="CartItem.variant_id", cascade="all, delete-orphan")


class CartItem(Model):
    __tablename__ = "cart_items"
    id: Mapped[int] = mapped_column(primary_key=True)
    cart_id: Mapped[int] = mapped_column(ForeignKey("carts.id"), index=True)
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"))
    quantity: Mapped[int] = mapped_column(Integer)
    variant = relationship("Variant")

    __table_args__ = (
        UniqueConstraint("cart_id", "variant_id", name="uq_cart_items_cart_variant"),
        CheckConstraint("quantity > 0", name="quantity_positive"),
    )
