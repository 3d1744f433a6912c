from datetime import datetime, timezone

from sqlalchemy import JSON, DateTime, String
from sqlalchemy.types import TypeDecorator

from .. import clock
from ..domain.order import OrderStatus


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC on the way out, whatever the backend stores (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class OrderStatusText(TypeDecorator):
    """orders.status: the documented spelling in the column, an `OrderStatus` member in Python,
    so every read (a mapped Order, a Core select of the column) compares states the same way:
    `order.status is OrderStatus.PAID`."""

    impl = String(20)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return None if value is None else OrderStatus(value).value

    def process_result_value(self, value, dialect):
        return None if value is None else OrderStatus(value)


def now_utc() -> datetime:
    return clock.current().now()


JSONType = JSON
