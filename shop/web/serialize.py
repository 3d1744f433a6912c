"""How an order is shown: the JSON shape of docs/REFERENCE.md, Storefront, shared by HTML and JSON
views of the storefront and the console."""

from __future__ import annotations

from ..domain.order import UNPAID, OrderStatus
from ..domain.timestamps import iso
from ..orders.deadline import pay_by

PAYMENT_STATUS = {
    OrderStatus.PENDING_PAYMENT: "not_started",
    OrderStatus.PAYMENT_INITIATED: "open",
    OrderStatus.PAID: "paid",
    OrderStatus.PAYMENT_FAILED: "failed",
    OrderStatus.CANCELLED: "cancelled",
}


def in_line(order) -> bool:
    """Waiting in line for its payment page (the provider's budget for new sessions was spent)."""
    return getattr(order, "payment_queued_at", None) is not None and order.status in UNPAID


def order_json(order) -> dict:
    payment = None
    if in_line(order):
        payment = {"session_id": None, "url": None, "status": "queued"}
    elif order.payment_session_id:
        status = PAYMENT_STATUS[order.status]
        if status == "open" and order.payment_processing_at is not None:
            status = "processing"  # checkout finished; the provider settles the payment later
        elif status == "open" and getattr(order, "payment_declined_at", None) is not None:
            status = "declined"  # a card was refused on the payment page, which takes another
        payment = {"session_id": order.payment_session_id, "url": order.payment_session_url, "status": status}
    return {
        "reference": order.reference,
        "status": order.status,
        "version": order.version,
        "total": order.total,
        "currency": order.currency,
        "inventory_restored": bool(order.inventory_restored),
        "lines": [
            {
                "variant_id": l.variant_id,
                "sku": l.sku,
                "name": l.name,
                "quantity": l.quantity,
                "unit_price": l.unit_price,
            }
            for l in order.lines
        ],
        "payment": payment,
        "refunds": [{"id": r.id, "amount": r.amount, "status": r.status} for r in order.refunds],
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
        "pay_by": iso(pay_by(order)),
        # Why the last payment did not go through, in the customer's words, while that is news:
        # a card declined on the open payment page, or a failed payment (PaymentFailed).
        "last_payment_error": last_payment_error(order, payment),
        "ships": bool(getattr(order, "ships", False)),
        "shipping": getattr(order, "shipping_details", None),
    }


def last_payment_error(order, payment: dict | None) -> str | None:
    if order.status == OrderStatus.PAYMENT_FAILED or (payment and payment["status"] == "declined"):
        return order.last_payment_error or "Your payment did not go through."
    return None


def watch_state(data: dict) -> str:
    """What the order page's script compares to notice a change worth showing (static/shop.js
    computes the same string from the JSON): the state, the payment's, the stock's return and
    the refunds."""
    payment = data.get("payment")
    return "/".join(
        [
            data["status"],
            payment["status"] if payment else "-",
            "restored" if data.get("inventory_restored") else "-",
            ",".join(r["status"] for r in data.get("refunds") or []),
        ]
    )


def keeps_changing(data: dict) -> bool:
    """Whether something other than the customer can still change what the order page says: a
    payment to make or settling, the deadline, the stock coming back, a refund on its way."""
    status = OrderStatus(data["status"])
    if status in UNPAID or status is OrderStatus.PAYMENT_INITIATED:
        return True
    if status is OrderStatus.CANCELLED:
        refunds = [r["status"] for r in data.get("refunds") or []]
        payment = (data.get("payment") or {}).get("status")
        return not data.get("inventory_restored") or payment == "processing" or "pending" in refunds
    return False


def order_summary_json(order) -> dict:
    return {
        "reference": order.reference,
        "status": order.status,
        "total": order.total,
        "currency": order.currency,
        "created_at": iso(order.created_at),
    }
