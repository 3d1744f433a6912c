"""Persistence: the mapped tables. Every state change of an order goes through the domain's
guarded transitions (shop.domain.order.OrderRules); these classes only add columns."""

from .catalog import Product, Variant, InventoryItem
from .cart import Cart, CartItem
from .orders import Order, OrderLine
from .outbox import OutboxEvent, OutboxDelivery, ScheduledCommand
from .payments import WebhookReceipt, ProcessedStripeEvent, PaymentProofRefusal, ProviderRefusal, Refund, KeyValue
from .ops import RestoreWarning, ReconciliationCycle, Lease, Operator, OperatorAction

__all__ = [
    "Product",
    "Variant",
    "InventoryItem",
    "Cart",
    "CartItem",
    "Order",
    "OrderLine",
    "OutboxEvent",
    "OutboxDelivery",
    "ScheduledCommand",
    "WebhookReceipt",
    "ProcessedStripeEvent",
    "PaymentProofRefusal",
    "ProviderRefusal",
    "Refund",
    "KeyValue",
    "RestoreWarning",
    "ReconciliationCycle",
    "Lease",
    "Operator",
    "OperatorAction",
]
