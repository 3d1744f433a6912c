"""The console's vocabulary: the shop's codes (order states, events, handlers, command kinds, work
and refund statuses, audit outcomes, the provider's decline and refund-failure codes) in the words
an operator reads on the pages. An order's state is said as the customer reads it (shop/web/words.py).

Only the HTML says these: the console's JSON keeps the codes (docs/REFERENCE.md, Console). An
unknown code is shown as it is, never hidden."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from functools import partial

from markupsafe import Markup

from ..domain.events import EventName
from ..domain.refunds import RefundStatus
from ..domain.timestamps import iso
from ..emails import REFUND_FAILURE_WORDS
from ..models import CommandKind, ReceiptOutcome, UnknownPaymentStatus, WarningState, WorkStatus
from ..provider.guard import BreakerState
from ..web.words import status_words
from .format import human_time
from .ops_words import OPS_TEMPLATE_WORDS

EVENT_WORDS = {
    EventName.ORDER_PLACED: "Order placed",
    EventName.PAYMENT_INITIATED: "Payment page opened",
    EventName.ORDER_AUTHORIZED: "Payment held, to be taken when shipped",
    EventName.ORDER_PAID: "Paid",
    EventName.ORDER_PAYMENT_FAILED: "Payment failed",
    EventName.ORDER_CANCELLED: "Cancelled",
    EventName.ORDER_SHIPPED: "Shipped",
}

# The handlers of shop/saga (HANDLERS), by the name their deliveries carry.
HANDLER_WORDS = {
    "restore_inventory": "Put the stock back",
    "payment_failed_followups": "Follow up the failed payment",
    "send_order_confirmation": "Email the order confirmation",
    "send_cancellation_email": "Email the cancellation",
    "send_order_placed_email": "Email the order's link",
    "send_shipment_email": "Email the shipment notice",
}

COMMAND_WORDS = {
    CommandKind.EXPIRE_UNPAID_ORDER: "Payment deadline",
    CommandKind.SEND_EMAIL: "Email to the customer",
    CommandKind.REFUND_PAYMENT: "Refund to the customer",
    CommandKind.SETTLE_UNKNOWN_PAYMENT: "Refund of money for no order",
    CommandKind.OFFER_PAYMENT_LINK: "Email a payment link",
    CommandKind.CAPTURE_PAYMENT: "Capture the held payment and ship",
    CommandKind.VOID_PAYMENT: "Void the held payment",
    CommandKind.END_HOLD: "Hold's deadline: void and cancel if not shipped",
}

WORK_WORDS = {
    WorkStatus.PENDING: "to do",
    WorkStatus.PROCESSING: "running",
    WorkStatus.DONE: "done",
    WorkStatus.DEAD: "gave up: needs an operator",
    WorkStatus.DISCARDED: "discarded by an operator",
    WorkStatus.OBSOLETE: "no longer needed",
    "waiting": "waiting for the provider",  # rows.WAITING: pending work the provider's outage holds back
}

REFUND_WORDS = {
    RefundStatus.PENDING: "on its way",
    RefundStatus.SUCCEEDED: "money returned",
    RefundStatus.FAILED: "did not go through",
    RefundStatus.CANCELED: "cancelled at the provider",
}

RECEIPT_WORDS = {
    ReceiptOutcome.ACCEPTED: "applied",
    ReceiptOutcome.DUPLICATE: "already applied",
    ReceiptOutcome.IGNORED: "nothing to do",
    ReceiptOutcome.REJECTED: "rejected",
    ReceiptOutcome.FAILED: "failed, the provider retries",
}

WARNING_WORDS = {
    WarningState.OPEN: "open",
    WarningState.RESOLVED: "resolved",
    WarningState.DUPLICATE: "same as another warning",
}

# The provider's event types the webhook takes (shop.provider.views.EVENT_TYPES).
WEBHOOK_EVENT_WORDS = {
    "checkout.session.completed": "Payment page completed",
    "checkout.session.async_payment_succeeded": "Delayed payment succeeded",
    "checkout.session.async_payment_failed": "Delayed payment failed",
    "checkout.session.expired": "Payment page expired",
    "refund.updated": "Refund updated",
    "refund.failed": "Refund failed",
    "payment_intent.payment_failed": "Card refused on the payment page",
    "payment_intent.canceled": "Held payment released",
    "charge.expired": "Held payment lapsed",
}

# Money for an order this database does not know (docs/REFERENCE.md, GET /console/refunds).
UNKNOWN_PAYMENT_WORDS = {
    UnknownPaymentStatus.CHECKING: "being checked with the provider",
    UnknownPaymentStatus.APPLIED: "applied to its order",
    UnknownPaymentStatus.NOT_PAID: "no money was taken",
    UnknownPaymentStatus.REFUND_PENDING: "refund on its way",
    UnknownPaymentStatus.REFUNDED: "money returned",
    UnknownPaymentStatus.REFUND_FAILED: "refund did not go through: needs an operator",
    UnknownPaymentStatus.NOT_OURS: "not this shop's payment page: needs an operator",
    UnknownPaymentStatus.VOIDED: "only held, released: nothing was taken",
}

# Which path found money for an unknown order (payments.apply's `source`).
FOUND_VIA_WORDS = {
    "webhook": "the provider's notification",
    "sweep": "the reconciliation sweep",
    "sweep: unknown money": "the sweep's look at the provider's payments",
    "return": "the customer's return from the payment page",
    "deadline": "the order's payment deadline",
    "console": "an operator asking the provider",
}

# The refunds list's filters (queries.REFUND_FILTERS), as its links read.
REFUND_FILTER_WORDS = {
    "failed": "did not go through",
    "pending": "on their way",
    "succeeded": "money returned",
    "settled": "settled outside the shop",
}


# The payment provider as the circuit breaker sees it (provider.guard), for the dashboard.
BREAKER_WORDS = {
    BreakerState.CLOSED: "Reachable: payments start normally.",
    BreakerState.OPEN: "Unavailable: checkout takes orders and holds their stock; customers pay later with “Pay now”.",
    BreakerState.HALF_OPEN: "Recovering: the shop is checking whether the provider answers again; payments start as "
    "soon as it does.",
}


# What a re-apply did, in words ({detail}: the guarded path's own).
REAPPLY_WORDS = {
    "duplicate": "This event was already applied: nothing changed.",
    "noop": "Nothing to change: {detail}.",
    "unknown_order": "The event names no order of this shop ({detail}): nothing changed.",
    "unknown_refund": "The event names none of this shop's refunds ({detail}): nothing changed.",
    "not_used": "The shop does not act on this event ({detail}): nothing changed.",
}


class AuditOutcome(StrEnum):
    """How an operator's action went, from its answer's HTTP status (the audit's `status`)."""

    DONE = "done"
    REFUSED = "refused"
    FAILED = "failed"


AUDIT_WORDS = {
    AuditOutcome.DONE: "done",
    AuditOutcome.REFUSED: "refused",
    AuditOutcome.FAILED: "failed",
}


def audit_outcome(http_status: int) -> AuditOutcome:
    if http_status < 400:
        return AuditOutcome.DONE
    return AuditOutcome.REFUSED if http_status < 500 else AuditOutcome.FAILED


def refusal_words(code: str | None) -> str:
    """The provider's decline or refund-failure code in words (the customer's, where the emails
    have them); a code without words is shown as it is."""
    if code in REFUND_FAILURE_WORDS:
        return REFUND_FAILURE_WORDS[code]
    return (code or "").replace("_", " ")


def _said(table: dict, code) -> str:
    return table.get(code, str(code) if code is not None else "–")


# Each a code (a str) in its table's words.
event_words = partial(_said, EVENT_WORDS)
handler_words = partial(_said, HANDLER_WORDS)
command_words = partial(_said, COMMAND_WORDS)
work_words = partial(_said, WORK_WORDS)
refund_words = partial(_said, REFUND_WORDS)
receipt_words = partial(_said, RECEIPT_WORDS)
warning_words = partial(_said, WARNING_WORDS)


def webhook_event_words(event_type: str | None) -> str:
    return _said(WEBHOOK_EVENT_WORDS, event_type) if event_type else "no event type"


def unknown_payment_words(status: str) -> str:
    return _said(UNKNOWN_PAYMENT_WORDS, status)


def found_via_words(source: str) -> str:
    return _said(FOUND_VIA_WORDS, source)


def action_words(action: str) -> str:
    """An audited action (its endpoint's name) as a phrase: `retry_delivery` -> "retry delivery"."""
    return action.replace("_", " ")


def when(value: str | datetime | None) -> Markup:
    """A time for a page: UTC as the text (what a page without scripts shows), in a <time> whose
    `datetime` static/shop.js reads to add the browser's local time beside it."""
    text = human_time(value)
    stamp = iso(value) if isinstance(value, datetime) else value
    if not stamp or text == stamp:
        return Markup.escape(text)
    return Markup('<time datetime="{}" data-local data-seconds data-beside>{}</time>').format(stamp, text)


# What the console's templates call (shop/console/routes.py hands them over).
TEMPLATE_WORDS = {
    "when": when,
    "state_words": status_words,
    "event_words": event_words,
    "handler_words": handler_words,
    "command_words": command_words,
    "work_words": work_words,
    "refund_words": refund_words,
    "receipt_words": receipt_words,
    "warning_words": warning_words,
    "webhook_event_words": webhook_event_words,
    "unknown_payment_words": unknown_payment_words,
    "found_via_words": found_via_words,
    "refund_filter_words": REFUND_FILTER_WORDS,
    **OPS_TEMPLATE_WORDS,
    "refusal_words": refusal_words,
    "action_words": action_words,
    "audit_outcome": audit_outcome,
    "audit_words": AUDIT_WORDS,
}
