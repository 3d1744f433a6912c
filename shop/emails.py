"""What each customer email says, rendered from Jinja templates under templates/email/.

A template's first line is `Subject: ...`; the rest, after one blank line, is the body. Every
email is rendered when it is sent, from what the database says then, so it never states
something the order has moved past; and every email is durable work with its own retries and
dead letter: the confirmation and the cancellation notice are their event's own delivery
(saga.notifications), the others (a failed payment, a refund) `send_email` scheduled commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import current_app, render_template
from sqlalchemy import select
from sqlalchemy.orm import joinedload

from . import logs, mailer
from .domain.order import LIVE, OrderStatus
from .domain.refunds import NOT_RETURNED, SUCCEEDED, charged_for
from .extensions import db
from .models import Order, Refund
from .orders.deadline import pay_by
from .public_urls import public_url_for

# An email about a state the order can leave: once it has, the email would mislead and is not
# sent ("your items are held, try again" after the customer cancelled). The others are about
# final states.
# The order-placed email ("your order is waiting for its payment, here is its private link")
# is not sent once the order is paid or cancelled: the receipt or the notice says so, with the link.
STILL_TRUE_WHILE = {
    "payment_failed": {OrderStatus.PAYMENT_FAILED},
    "payment_link": {OrderStatus.PENDING_PAYMENT},
    "order_placed": {OrderStatus.PENDING_PAYMENT, OrderStatus.PAYMENT_INITIATED, OrderStatus.PAYMENT_FAILED},
}
# The link to an order waiting for payment (orders.links): news only while it still waits.
WHILE_LIVE = {"order_link"}


@dataclass
class Email:
    subject: str
    body: str
    html: str | None = None  # the same email as HTML, for the templates that have one


# The emails sent as HTML too (templates/email/<name>.html next to <name>.txt): the receipt,
# whose items read best as a table.
HTML_TEMPLATES = {"order_paid"}
# The emails that list the order's lines (receipt_context): read with the order, one statement.
LISTS_LINES = {"order_paid"}


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


def utc_words(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def reaching_the_shop(shop: str) -> dict[str, str]:
    """How an email tells the customer to reach the shop (MAIL_REPLY_TO, SHOP_CONTACT): `reach`,
    words that fit "... with your order number" ("reply to this email" only when replies have
    somewhere to go), and `footer`, the closing line every email ends with ("" when neither is set)."""
    cfg = current_app.config
    contact, reply_to = cfg.get("SHOP_CONTACT"), cfg.get("MAIL_REPLY_TO")
    if contact:
        where = f"write to {contact}" if "@" in contact and "://" not in contact else f"contact us at {contact}"
    else:
        where = f"contact us through {shop}"
    if reply_to:
        footer = "Questions? Reply to this email" + (f", or {where}." if contact else ".")
        return {"reach": "reply to this email", "footer": footer}
    return {"reach": where, "footer": f"Questions? {where[0].upper()}{where[1:]}." if contact else ""}


def render(template: str, order: Order) -> Email | None:
    """The email `template` for `order` as things stand now, or None when it is no longer true."""
    wanted = STILL_TRUE_WHILE.get(template)
    if wanted is not None and order.status not in wanted:
        return None
    if template in WHILE_LIVE and order.status not in LIVE:
        return None
    shop = public_url_for("storefront.catalog")
    context: dict[str, Any] = dict(
        order=order,
        link=public_url_for("storefront.order_page", reference=order.reference, token=order.access_token),
        shop=shop,
        deadline=utc_words(pay_by(order)),
        when=utc_words,
        **reaching_the_shop(shop),
    )
    if template == "order_shipped" and order.shipped_at is None:
        return None
    if template in ("order_expired", "order_cancelled", "order_hold_ended"):
        context["cancelled_at"] = order.cancelled_at
    if template == "refund_issued":
        refunds = (
            db.session.execute(
                select(Refund).where(Refund.order_id == order.id, Refund.status == SUCCEEDED).order_by(Refund.id)
            )
            .scalars()
            .all()
        )
        if not refunds:
            return None
        context["refund"] = refunds[-1]
    if template == "refund_failed":
        # Still true when it is sent: an operator's retry that went through, or a settlement
        # outside the shop, makes "it did not go through" wrong.
        refunds = (
            db.session.execute(
                select(Refund)
                .where(Refund.order_id == order.id, Refund.status.in_(NOT_RETURNED), Refund.settled_at.is_(None))
                .order_by(Refund.id)
            )
            .scalars()
            .all()
        )
        if not refunds:
            return None
        context["refund"], context["why"] = refunds[-1], refund_failure_words(refunds[-1].failure_reason)
    if template == "order_paid":
        context.update(receipt_context(order))
    text = render_template(f"email/{template}.txt", **context)
    head, _, body = text.partition("\n\n")
    subject = head.removeprefix("Subject:").strip()
    html = render_template(f"email/{template}.html", subject=subject, **context) if template in HTML_TEMPLATES else None
    return Email(subject, body.strip() + "\n", html)


def receipt_context(order: Order) -> dict:
    """What the receipt lists: each line with its quantity, unit price and amount, the total, and
    where the goods go (the address collected with the payment; digital orders ship nothing)."""
    lines = [
        dict(name=line.name, sku=line.sku, quantity=line.quantity, unit_price=line.unit_price,
             amount=line.quantity * line.unit_price)
        for line in order.lines
    ]  # fmt: skip
    shipping = order.shipping_details or None
    address = (shipping or {}).get("address") or {}
    shipping_lines = (
        [
            part
            for part in (
                shipping.get("name"),
                address.get("line1"),
                address.get("line2"),
                " ".join(p for p in (address.get("postal_code"), address.get("city")) if p)
                + (f", {address['state']}" if address.get("state") else ""),
                address.get("country"),
            )
            if part
        ]
        if shipping
        else []
    )
    # What the payment charged: the goods plus Stripe Tax's tax, when the shop charges tax.
    tax, paid = order.tax or 0, charged_for(order.total, order.charged)
    return dict(
        items=lines, ships=bool(order.ships), shipping=shipping, shipping_lines=shipping_lines, tax=tax, paid=paid
    )


def send(order_id: int, template: str, *, tag: str | None, to: str | None = None) -> bool:
    """Render `template` for the order as things stand now and hand it to the mailer under the key
    `<reference>-<template>[-<tag>]` (BK-7KQ2M9XD-order_paid-event: the file's name in the demo's
    mail folder, so a person finds an order's emails by its reference; a retry under the same key
    replaces, never duplicates, in the file outbox); to `to` when an operator sent it to another
    address than the order's (saga.email_resends). False when
    there is nothing to send: the order is gone, or the email would no longer be true. A mail
    server that does not take it raises (mailer.MailNotSent): the caller's row is retried. `to`:
    another address than the order's (an operator's "send to another address")."""
    order = db.session.get(Order, order_id, options=[joinedload(Order.lines)] if template in LISTS_LINES else ())
    if order is None:
        return False
    logs.learn(order_ref=order.reference)
    email = render(template, order)
    if email is None:
        return False
    key = "-".join(part for part in (order.reference, template, tag) if part)
    mailer.send(to or order.email, email.subject, email.body, key=key, html=email.html)
    return True
