"""Saga handlers: what happens after a commit, each in its own transaction, one delivery each.

HANDLERS maps the names used in outbox.subscriptions to functions `handler(event, now)`.
A handler runs inside the delivery runner's transaction and never commits itself: its writes
and the delivery's "done" commit together.
"""

from .inventory import restore_inventory
from .notifications import (
    payment_failed_followups,
    send_cancellation_email,
    send_order_confirmation,
    send_order_placed_email,
    send_shipment_email,
)

HANDLERS = {
    "restore_inventory": restore_inventory,
    "payment_failed_followups": payment_failed_followups,
    "send_order_placed_email": send_order_placed_email,
    "send_order_confirmation": send_order_confirmation,
    "send_cancellation_email": send_cancellation_email,
    "send_shipment_email": send_shipment_email,
}
