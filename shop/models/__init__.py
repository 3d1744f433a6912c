"""Persistence: the mapped tables and the vocabularies their status columns hold. An order's row
is read here and written only by the order store (shop.store.order_store)."""

from .cart import AnswerState, Cart, CartItem, CartState, IdempotentRequest
from .catalog import InventoryItem, Product, Variant
from .ops import (
    CardAcknowledgement,
    CycleStatus,
    EmailResend,
    Lease,
    Operator,
    OperatorAction,
    PrunedDetail,
    ReconciliationCycle,
    RestoreWarning,
    StockCorrection,
    WarningState,
)
from .orders import Order, OrderLine
from .outbox import CommandKind, OutboxDelivery, OutboxEvent, ScheduledCommand, WorkStatus
from .payments import (
    KeyValue,
    PaymentProofRefusal,
    ProcessedStripeEvent,
    ProviderRefusal,
    ReceiptOutcome,
    Refund,
    RefundRestock,
    RefusalKind,
    UnknownPayment,
    UnknownPaymentStatus,
    WebhookReceipt,
)

__all__ = [
    "CardAcknowledgement",
    "Product",
    "Variant",
    "InventoryItem",
    "RefundRestock",
    "Cart",
    "CartItem",
    "CartState",
    "AnswerState",
    "IdempotentRequest",
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
