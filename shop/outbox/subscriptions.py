"""Which handlers listen to which event, as data. One delivery row per (event, handler)."""

from ..domain.events import EventName

SUBSCRIPTIONS: dict[EventName, list[str]] = {
    EventName.ORDER_PLACED: ["send_order_placed_email"],
    EventName.ORDER_CANCELLED: ["restore_inventory", "send_cancellation_email"],
    EventName.ORDER_PAYMENT_FAILED: ["payment_failed_followups"],
    EventName.ORDER_PAID: ["send_order_confirmation"],
    EventName.ORDER_SHIPPED: ["send_shipment_email"],
}
