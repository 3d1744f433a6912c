"""How an order is shown: the JSON shape of docs/REFERENCE.md, Storefront, shared by HTML and JSON views."""

from __future__ import annotations

from datetime import datetime

from flask import current_app

from ..domain.deadlines import unpaid_deadline
from ..domain.order import OrderStatus, UNPAID
from ..domain.refunds import NOT_RETURNED, PENDING, SUCCEEDED


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


def in_line(order) -> bool:
    """Waiting in line for its payment page (the provider's budget for new sessions was spent)."""
    return getattr(order, "payment_queued_at", None) is not None and OrderStatus(order.status) in UNPAID


def order_json(order) -> dict:
    payment = None
    if in_line(order):
        payment = {"session_id": None, "url": None, "status": "queued"}
    elif order.payment_session_id:
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
    }


# The badge a customer sees for an order, in the words of the page's own text: the state alone
# does not say enough ("At the payment page" for a payment the provider is settling, "Cancelled"
# for an order whose window ran out), so the payment and the cancellation's reason count too.
BADGES = {
    "awaiting": "Awaiting payment",
    "in-line": "In line for payment",
    "at-payment-page": "At the payment page",
    "processing": "Payment processing",
    "failed": "Payment failed",
    "paid": "Paid",
    "expired": "Expired",
    "cancelled": "Cancelled",
    "refund-pending": "Cancelled, refund on its way",
    "refund-failed": "Cancelled, refund did not go through",
    "refunded": "Cancelled, refunded",
}


def badge(data: dict) -> tuple[str, str]:
    """(key, words) for an order's JSON as `order_json` makes it, with `cancelled_because` added
    for a cancelled order. The key is also the badge's CSS class."""
    status = data["status"]
    payment = (data.get("payment") or {}).get("status")
    if payment == "queued":
        key = "in-line"
    elif status == OrderStatus.PENDING_PAYMENT.value:
        key = "awaiting"
    elif status == OrderStatus.PAYMENT_INITIATED.value:
        key = "processing" if payment == "processing" else "at-payment-page"
    elif status == OrderStatus.PAYMENT_FAILED.value:
        key = "failed"
    elif status == OrderStatus.PAID.value:
        key = "paid"
    else:
        # A refund an operator settled outside the shop is done, whatever the provider said.
        settled = set(data.get("refunds_settled") or ())
        refunds = [r["status"] for r in data.get("refunds") or [] if r["id"] not in settled]
        if any(status in NOT_RETURNED for status in refunds):
            key = "refund-failed"
        elif PENDING in refunds:
            key = "refund-pending"
        elif SUCCEEDED in refunds or settled:
            key = "refunded"
        else:
            key = "expired" if data.get("cancelled_because") == "expired" else "cancelled"
    return key, BADGES[key]


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
    if data["status"] in UNPAID or data["status"] == OrderStatus.PAYMENT_INITIATED.value:
        return True
    if data["status"] == OrderStatus.CANCELLED.value:
        refunds = [r["status"] for r in data.get("refunds") or []]
        payment = (data.get("payment") or {}).get("status")
        return not data.get("inventory_restored") or payment == "processing" or "pending" in refunds
    return False


# Why a refund did not go through, in the customer's words, by the provider's `failure_reason`
# (Stripe's values); anything else gets the last line.
REFUND_FAILURE_WORDS = {
    "expired_or_canceled_card": "the card it would go back to has expired or was cancelled",
    "lost_or_stolen_card": "the card it would go back to was reported lost or stolen",
    "declined": "your bank declined it",
    None: "the payment provider could not complete it",
}


def refund_failure_words(reason: str | None) -> str:
    return REFUND_FAILURE_WORDS.get(reason, REFUND_FAILURE_WORDS[None])


def order_summary_json(order) -> dict:
    return {
        "reference": order.reference,
        "status": order.status,
        "total": order.total,
        "currency": order.currency,
        "created_at": iso(order.created_at),
    }
