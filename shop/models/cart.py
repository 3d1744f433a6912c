from enum import StrEnum

from sqlalchemy import CheckConstraint, ForeignKey, Integer, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from ..extensions import Model
from .types import JSONType, UTCDateTime, now_utc


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


class AnswerState(StrEnum):
    """Where a request sent with an Idempotency-Key is (`idempotent_requests.state`)."""

    RUNNING = "running"  # its first request has not answered yet
    DONE = "done"  # answered: a repeat gets the stored answer


class IdempotentRequest(Model):
    """A storefront POST sent with an `Idempotency-Key` and its first answer, kept for a day
    (shop.web.idempotency): a retry with the same key and body gets that answer again."""

    __tablename__ = "idempotent_requests"
    id: Mapped[int] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(String(64))  # the browser's id (its session cookie)
    key: Mapped[str] = mapped_column(String(255))
    fingerprint: Mapped[str] = mapped_column(String(64))  # of the method, path and body
    state: Mapped[str] = mapped_column(String(16), default=AnswerState.RUNNING)
    answer_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    answer_headers = mapped_column(JSONType, nullable=True)
    answer_body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at = mapped_column(UTCDateTime, default=now_utc, nullable=False, index=True)
    completed_at = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (UniqueConstraint("scope", "key", name="uq_idempotent_requests_scope_key"),)
