"""The emails an order was sent, and an operator's resend of one of them.

Which emails an order had is read from the work that sent them: the confirmation and the
cancellation notice are deliveries of their event (saga.notifications), the others `send_email`
commands (a failed payment, a refund, and earlier resends). A resend is one more `send_email`
command, the same path with the same retries and dead letter; the email is rendered when it is
sent, from what the order is then, and one that would no longer be true is refused up front
(emails.render). Each resend is an `email_resends` row named by the submission's key, written in
the command's transaction: the same click sent twice sends once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from .. import emails
from ..domain.deadlines import utcnow
from ..domain.events import EventName
from ..domain.order import cancelled_because
from ..domain.results import SubmissionOutcome
from ..extensions import db
from ..models import CommandKind, EmailResend, Order, OutboxDelivery, OutboxEvent, ScheduledCommand, WorkStatus
from ..outbox import schedule_command, uow
from .notifications import CANCELLATION_EMAILS

log = logging.getLogger("shop.saga")

# What each email is, in an operator's words.
EMAIL_NAMES = {
    "order_placed": "Order placed (its private link)",
    "order_paid": "Order confirmation (paid)",
    "order_cancelled": "Cancellation notice (cancelled by the customer)",
    "order_expired": "Cancellation notice (payment window ran out)",
    "payment_failed": "Payment failed",
    "refund_issued": "Refund issued",
    "refund_failed": "Refund did not go through",
    "order_link": "Link to the order waiting for payment (asked for at checkout)",
    "order_hold_ended": "Cancellation notice (not shipped before its payment hold lapsed)",
    "order_shipped": "Shipment notice (with the tracking number when given)",
}


# The event deliveries that send one email each, by handler (the cancellation's depends on why).
EVENT_EMAILS = {
    "send_order_placed_email": "order_placed",
    "send_order_confirmation": "order_paid",
    "send_shipment_email": "order_shipped",
}


@dataclass
class SentEmail:
    template: str
    name: str
    sent_at: datetime | None
    via: str  # "event" or "command"
    work_id: int
    resent_by: str | None = None


def _settled_at(order_id: int) -> datetime | None:
    """When the order was first paid or cancelled (its event), or None while it is neither."""
    return db.session.execute(
        select(func.min(OutboxEvent.created_at)).where(
            OutboxEvent.order_id == order_id,
            OutboxEvent.name.in_((EventName.ORDER_PAID, EventName.ORDER_CANCELLED)),
        )
    ).scalar()


def sent_emails(order_id: int) -> list[SentEmail]:
    """Every email the order was sent (its sending work done), oldest first."""
    session = db.session
    found: list[SentEmail] = []
    deliveries = session.execute(
        select(OutboxDelivery.id, OutboxDelivery.handler, OutboxDelivery.completed_at, OutboxEvent.payload)
        .join(OutboxEvent, OutboxEvent.id == OutboxDelivery.event_id)
        .where(
            OutboxDelivery.order_id == order_id,
            OutboxDelivery.status == WorkStatus.DONE,
            OutboxDelivery.handler.in_(tuple(EVENT_EMAILS) + ("send_cancellation_email",)),
        )
    ).all()
    settled_at = _settled_at(order_id)
    for d in deliveries:
        if d.handler == "send_order_placed_email" and settled_at and d.completed_at and d.completed_at >= settled_at:
            continue  # ran once the order was paid or cancelled: nothing was sent (emails.STILL_TRUE_WHILE)
        if d.handler in EVENT_EMAILS:
            template = EVENT_EMAILS[d.handler]
        else:
            template = CANCELLATION_EMAILS.get(cancelled_because(d.payload["reason"]))  # an OrderCancelled's
        if template:
            found.append(SentEmail(template, EMAIL_NAMES[template], d.completed_at, "event", d.id))
    resent = dict(
        session.execute(
            select(EmailResend.command_id, EmailResend.operator).where(EmailResend.order_id == order_id)
        ).all()
    )
    commands = session.execute(
        select(ScheduledCommand.id, ScheduledCommand.payload, ScheduledCommand.completed_at).where(
            ScheduledCommand.order_id == order_id,
            ScheduledCommand.kind == CommandKind.SEND_EMAIL,
            ScheduledCommand.status == WorkStatus.DONE,
        )
    ).all()
    for c in commands:
        template = (c.payload or {}).get("template")
        if template in EMAIL_NAMES:
            found.append(SentEmail(template, EMAIL_NAMES[template], c.completed_at, "command", c.id, resent.get(c.id)))
    return sorted(found, key=lambda e: (e.sent_at is None, e.sent_at or datetime.min, e.work_id))


ResendOutcome = SubmissionOutcome  # MISSING: no such order


@dataclass
class Resend:
    """`why` for REFUSED: `not_sent` (the order never had this email), `no_longer_true` (it would
    now say something the order has moved past)."""

    outcome: ResendOutcome
    why: str | None = None
    command_id: int | None = None


def resend_email(
    order_id: int,
    template: str,
    *,
    operator: str,
    request_key: str,
    now: datetime | None = None,
    to: str | None = None,
) -> Resend:
    """Send the order's `template` email again, once per `request_key`; to `to` when the operator
    gave another address than the order's (it is in the command's payload, not on the order)."""
    now = now or utcnow()
    return uow.once_per_key(
        lambda: _resend_once(order_id, template, operator, request_key, now, to), lambda: _earlier(request_key)
    )


def _earlier(request_key: str) -> Resend | None:
    row = db.session.execute(select(EmailResend).where(EmailResend.request_key == request_key)).scalar_one_or_none()
    if row is None:
        return None
    return Resend(ResendOutcome.ALREADY, command_id=row.command_id)


def _resend_once(
    order_id: int, template: str, operator: str, request_key: str, now: datetime, to: str | None
) -> Resend:
    with uow.transaction() as session:
        earlier = _earlier(request_key)
        if earlier is not None:
            return earlier
        order = session.get(Order, order_id)
        if order is None:
            return Resend(ResendOutcome.MISSING)
        if template not in {e.template for e in sent_emails(order_id)}:
            return Resend(ResendOutcome.REFUSED, "not_sent")
        if emails.render(template, order) is None:
            return Resend(ResendOutcome.REFUSED, "no_longer_true")
        command_id = schedule_command(
            session,
            CommandKind.SEND_EMAIL,
            now,
            order_id=order_id,
            payload={"template": template, "resent_by": operator, **({"to": to} if to else {})},
            now=now,
        )
        session.add(
            EmailResend(
                order_id=order_id,
                template=template,
                operator=operator,
                request_key=request_key,
                command_id=command_id,
                created_at=now,
            )
        )
        session.flush()
        log.warning(
            "order %s: %s sent the %s email again%s (cmd-%s)",
            order.reference,
            operator,
            template,
            " to another address" if to else "",
            command_id,
        )
        return Resend(ResendOutcome.DONE, command_id=command_id)
