"""An order whose payment could not start at checkout (the provider was down) is emailed its
payment link once payments work again.

At checkout such an order stands in PendingPayment, its items held for
UNPAID_HOLD_WITHOUT_SESSION_SECONDS, and its page offers "Pay now"; a customer who closed the tab
would not know when to come back. So the checkout's failed start schedules one durable command
for the order (`offer_payment_link`, committed before the answer). The command asks the provider
whether it answers: while it does not, the command waits for it (ProviderUnavailable: no
attempt spent; the breaker's recovery and the sweep wake it the moment it answers again). The
breaker's verdict answers for every such order at once: after an outage its one probe closed it,
and no order asks again; only after a failure the breaker has not yet seen answered does a
command ask the provider itself. Once it answers, the `payment_link` email goes out
(scheduling.commands, through shop.emails), once (its key is the order's), and only while it is
still true: an order the customer paid, started
paying, cancelled or let expire meanwhile gets nothing."""

from __future__ import annotations

import logging
from datetime import datetime

from .. import logs
from ..domain.order import OrderStatus
from ..extensions import db
from ..models import CommandKind, Order
from ..outbox import schedule_command, uow
from ..provider import gateway

log = logging.getLogger("shop.payments")

TEMPLATE = "payment_link"


def offer_payment_link_later(order_id: int, now: datetime) -> None:
    """After a checkout whose payment could not start: the command that emails the payment link
    once the provider answers (see the module). Its own small commit; failing to write it is
    logged and changes nothing the customer is told now (the page still offers "Pay now")."""
    try:
        with uow.transaction() as session:
            schedule_command(session, CommandKind.OFFER_PAYMENT_LINK, now, order_id=order_id, now=now)
    except Exception:  # noqa: BLE001 - bookkeeping: the order and its "Pay now" stand without it
        log.exception("order %s: could not schedule its payment-link email", order_id)


def still_waiting_for_payment(order: Order | None) -> bool:
    """The email is news only for an order that never got a payment page and is not in line for one."""
    return (
        order is not None
        and order.status is OrderStatus.PENDING_PAYMENT
        and order.payment_attempts == 0
        and order.payment_queued_at is None
    )


def ready_to_offer(order_id: int) -> bool:
    """The command's question (in the runner's transaction): is the payment link news, and do
    payments work again? False when the order no longer waits for a first payment page (nothing
    to send); raises ProviderUnavailable while the provider does not answer, so the runner keeps
    the row waiting for it; True when the email should go now (scheduling.commands sends it)."""
    order = db.session.get(Order, order_id)
    if order is not None:
        logs.learn(order_ref=order.reference)  # the probe's line below names the order too
    if order is None or not still_waiting_for_payment(order):
        return False
    if not gateway.answered_last():
        gateway.answers()  # the breaker has not seen the provider answer since a failure: ask once
    log.info("order %s: payments work again; emailing its payment link", order.reference)
    return True
