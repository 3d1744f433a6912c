"""Scheduled command kinds. Each runs inside the command runner's transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Callable

from .. import emails
from ..models import CommandKind, ScheduledCommand
from ..orders.cancel import expire_unpaid_order
from ..orders.fulfilment import execute_capture
from ..payments.holds import end_hold, execute_void
from ..payments.payment_link import TEMPLATE as PAYMENT_LINK
from ..payments.payment_link import ready_to_offer
from ..payments.refunds import execute_refund
from ..payments.unknown_money import settle_unknown_payment


def _order_id(row: ScheduledCommand) -> int:
    assert row.order_id is not None, row.id  # an order's commands are written with its id
    return row.order_id


def _expire(row: ScheduledCommand, now: datetime) -> None:
    expire_unpaid_order(_order_id(row), now)


def _send_email(row: ScheduledCommand, now: datetime) -> None:
    # An email that would no longer be true (the order moved on since it was queued: "your
    # items are held, try again" after the customer cancelled, say) is not sent.
    # `to`: an operator sent it to another address than the order's (saga.email_resends).
    emails.send(_order_id(row), row.payload.get("template"), tag=str(row.id), to=row.payload.get("to"))


def _payment_link(row: ScheduledCommand, now: datetime) -> None:
    # Waits for the provider (ready_to_offer raises while it does not answer); one email per
    # order, under the order's own name, and only while the order still waits for its payment.
    if ready_to_offer(_order_id(row)):
        emails.send(_order_id(row), PAYMENT_LINK, tag=None)


def _refund(row: ScheduledCommand, now: datetime) -> None:
    execute_refund(row.payload["refund_id"], now)


def _settle_unknown_payment(row: ScheduledCommand, now: datetime) -> None:
    settle_unknown_payment(row.payload["unknown_payment_id"], now)


def _capture(row: ScheduledCommand, now: datetime) -> None:
    execute_capture(_order_id(row), row.payload or {}, now)


def _end_hold(row: ScheduledCommand, now: datetime) -> None:
    end_hold(_order_id(row), now)


def _void(row: ScheduledCommand, now: datetime) -> None:
    execute_void(_order_id(row), row.payload or {}, now)


# Keyed by CommandKind; typed by str, as the outbox looks a row's stored kind up in it.
COMMANDS: dict[str, Callable[[ScheduledCommand, datetime], None]] = {
    CommandKind.EXPIRE_UNPAID_ORDER: _expire,
    CommandKind.SEND_EMAIL: _send_email,
    CommandKind.REFUND_PAYMENT: _refund,
    CommandKind.SETTLE_UNKNOWN_PAYMENT: _settle_unknown_payment,
    CommandKind.OFFER_PAYMENT_LINK: _payment_link,
    CommandKind.CAPTURE_PAYMENT: _capture,
    CommandKind.VOID_PAYMENT: _void,
    CommandKind.END_HOLD: _end_hold,
}
