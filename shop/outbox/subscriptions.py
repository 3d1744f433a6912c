"""Which handlers listen to which event, as data. One delivery row per (event, handler)."""

SUBSCRIPTIONS: dict[str, list[str]] = {
    "OrderCancelled": ["restore_inventory", "send_cancellation_email"],
    "OrderPaymentFailed": ["payment_failed_followups"],
    "OrderPaid": ["send_order_confirmation"],
}
