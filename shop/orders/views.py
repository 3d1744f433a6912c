"""How an order is shown: the JSON shape of docs/REFERENCE.md, Storefront, shared by HTML and JSON views."""
from __future__ import annotations

from datetime import datetime

from flask import current_app

from ..domain.deadlines import unpaid_deadline
from ..domain.order import OrderStatus, UNPAID


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def pay_by(order) -> datetime | None:
    status = OrderStatus(order.status)
    if status in UNPAID:
        return unpaid_deadline(order.updated_at, current_app.config["UNPAID_ORDER_EXPIRY_SECONDS"])
    if status is OrderStatus.PAYMENT_INITIATED:
        return order.payment_session_expires_at
    return None


# What a customer reads for each state (the JSON keeps the state names of docs/REFERENCE.md, Order states).
STATUS_WORDS = {
    OrderStatus.PENDING_PAYMENT.value: "Awaiting payment",
    OrderStatus.PAYMENT_INITIATED.value: "At the payment page",
    OrderStatus.PAYMENT_FAILED.value: "Payment failed",
    OrderStatus.PAID.value: "Paid",
    OrderStatus.CANCELLED.value: "Cancelled",
}


def status_words(status: str) -> str:
    return STATUS_WORDS.get(str(status), str(status))


PAYMENT_STATUS = {
    OrderStatus.PENDING_PAYMENT: "not_started",
    OrderStatus.PAYMENT_INITIATED: "open",
    OrderStatus.PAID: "paid",
    OrderStatus.PAYMENT_FAILED: "failed",
    OrderStatus.CANCELLED: "cancelled",
}


def order_json(order) -> dict:
    payment = None
    if order.payment_session_id:
        status = PAYMENT_STATUS[OrderStatus(order.status)]
        if status == "open" and order.payment_processing_at is not None:
            status = "processing"  # checkout finished; the provider settles the payment later
        payment = {"session_id": order.payment_session_id, "url": order.payment_session_url, "status": status}
    return {
        "reference": order.reference,
        "status": order.status,
        "version": order.version,
        "total": order.total,
        "currency": order.currency,
        "inventory_restored": bool(order.inventory_restored),
        "lines": [{"variant_id": l.variant_id, "sku": l.sku, "name": l.name, "quantity": l.quantity,
                   "unit_price": l.unit_price} for l in order.lines],
        "payment": payment,
        "refunds": [{"id": r.id, "amount": r.amount, "status": r.status} for r in order.refunds],
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
        "pay_by": iso(pay_by(order)),
    }


def order_summary_json(order) -> dict:
    return {"reference": order.reference, "status": order.status, "total": order.total,
            "currency": order.currency, "created_at": iso(order.created_at)}
