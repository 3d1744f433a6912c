"""Persistence: the mapped tables and the vocabularies their status columns hold. An order's row
is read here and written only by the order store (shop.store.order_store)."""

from .catalog import Product, Variant, InventoryItem
from .cart import Cart, CartItem, CartState
from .orders import Order, OrderLine
from .outbox import CommandKind, OutboxEvent, OutboxDelivery, ScheduledCommand, WorkStatus
from .payments import (
    WebhookReceipt,
    ReceiptOutcome,
    ProcessedStripeEvent,
    PaymentProofRefusal,
    ProviderRefusal,
    RefusalKind,
    Refund,
    KeyValue,
    UnknownPayment,
    UnknownPaymentStatus,
)
from .ops import (
    RestoreWarning,
    WarningState,
    ReconciliationCycle,
    CycleStatus,
    Lease,
    Operator,
    OperatorAction,
    PrunedDetail,
    EmailResend,
    StockCorrection,
    CardAcknowledgement,
)

__all__ = [
    "CardAcknowledgement",
    "Product",
    "Variant",
    "InventoryItem",
    "Cart",
    "CartItem",
    "CartState",
    "Order",
    "OrderLine",
    "OutboxEvent",
    "OutboxDelivery",
    "ScheduledCommand",
    "CommandKind",
    "WorkStatus",
    "WebhookReceipt",
    "UnknownPayment",
    "UnknownPaymentStatus",
    "ReceiptOutcome",
    "ProcessedStripeEvent",
    "PaymentProofRefusal",
    "ProviderRefusal",
    "RefusalKind",
    "Refund",
    "KeyValue",
    "RestoreWarning",
    "WarningState",
    "ReconciliationCycle",
    "CycleStatus",
    "Lease",
    "Operator",
    "OperatorAction",
    "PrunedDetail",
    "EmailResend",
    "StockCorrection",
]
