"""An operator refunds a paid order, in full or in part, and may give its stock back with it.

One transaction: the order locked (two refunds of one order cannot both take what is left), the
amount checked against what is left to refund (shop.domain.refunds), the refund row and its
command written (payments.refunds: the same command, Idempotency-Key, webhook, sweep watch,
retry and settle as late money), and, when asked, the chosen units of each line put back
(saga.line_restock: each unit once, whichever refund or restore asks). The submission's
`request_key` makes a double submit or a retried POST refund once: the second finds the first's
row and answers ALREADY.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from ..domain.deadlines import utcnow
from ..domain.order import OrderStatus
from ..domain.refunds import charged_for, refund_amount_problem, refundable
from ..domain.results import SubmissionOutcome
from ..extensions import db
from ..models import Order, Refund
from ..outbox import uow
from ..payments.refunds import record_operator_refund
from ..store import order_store
from .line_restock import GivenBack, RestockRefused, all_left, given_back, restock_lines

log = logging.getLogger("shop.saga")


RefundOutcome = SubmissionOutcome  # MISSING: no such order


@dataclass
class OrderRefund:
    """What `refund_order` did, in codes and facts (the console says it in words).
    `why`: the refusal's code (`not_paid`, `no_payment`, `not_positive`, `nothing_left`,
    `over_refundable`, `no_reason`, `already_restocked`, `restock_refused`); `left`: what was
    left to refund before this one (after it, for DONE); `restock_words`: what the restock gave
    back, or why it could not."""

    outcome: RefundOutcome
    why: str | None = None
    refund_id: int | None = None
    amount: int | None = None
    left: int | None = None
    restocked: bool = False
    restock_words: str = ""
    status: OrderStatus | None = None  # a refusal's: the order's state then
    given: tuple[GivenBack, ...] = ()


def refunded_so_far(order_id: int, session_id: str | None) -> list[int]:
    """The amounts of every refund of the order's paid session (see domain.refunds.refundable)."""
    return list(
        db.session.execute(
            select(Refund.amount).where(Refund.order_id == order_id, Refund.session_id == session_id)
        ).scalars()
    )


def refundable_now(order_id: int) -> int | None:
    """What is left to refund of a paid order now (None: not a paid order), for the form."""
    order = db.session.get(Order, order_id)
    if order is None or order.status is not OrderStatus.PAID or not order.payment_session_id:
        return None
    return refundable(charged_for(order.total, order.charged), refunded_so_far(order_id, order.payment_session_id))


def refund_order(
    order_id: int,
    *,
    amount: int | None,
    reason: str,
    restock: bool | dict[int, int],
    request_key: str,
    operator: str,
    now: datetime | None = None,
) -> OrderRefund:
    """`amount` in minor units, None for all that is left; `restock` the units to put back by
    line id, or True for every unit not yet back."""
    now = now or utcnow()
    wanted = {line: n for line, n in restock.items() if n > 0} if isinstance(restock, dict) else restock
    # The same key committed meanwhile by a submission that did not wait on the order's lock:
    # this one rolled back whole (its restock included); the other's refund is the answer.
    try:
        return uow.once_per_key(
            lambda: _refund_once(order_id, amount, (reason or "").strip(), wanted, request_key, operator, now),
            lambda: _earlier(request_key),
        )
    except RestockRefused as refused:  # rolled back whole: nothing refunded, nothing put back
        return OrderRefund(RefundOutcome.REFUSED, "restock_refused", restock_words=str(refused))


def _earlier(request_key: str) -> OrderRefund | None:
    earlier = db.session.execute(select(Refund).where(Refund.request_key == request_key)).scalar_one_or_none()
    return None if earlier is None else _already(earlier)


def _already(earlier: Refund) -> OrderRefund:
    return OrderRefund(
        RefundOutcome.ALREADY,
        refund_id=earlier.id,
        amount=earlier.amount,
        restocked=earlier.restock,
        given=tuple(given_back(earlier.id)),
    )


def _unpaid(order) -> str | None:
    """Why the order has no payment to refund (None: it has one)."""
    if order.status is not OrderStatus.PAID:
        return "not_paid"
    return None if order.payment_session_id else "no_payment"


def _refusal(order, amount: int | None, reason: str, restock: bool | dict[int, int]) -> tuple[str | None, int, int]:
    """Why a refund of this paid order may not go ahead (None: it may), the amount (the rest when
    none was asked) and what is left to refund: the facts a refusal's words name."""
    left = refundable(charged_for(order.total, order.charged), refunded_so_far(order.id, order.payment_session_id))
    if amount is None:  # the rest
        amount = left
        if left <= 0:
            return "nothing_left", amount, left
    problem = refund_amount_problem(amount, left)
    if problem is not None:
        return problem, amount, left
    if not reason:
        return "no_reason", amount, left
    if restock and order.inventory_restored:
        return "already_restocked", amount, left
    return None, amount, left


def _refund_once(order_id, amount, reason, restock, request_key, operator, now) -> OrderRefund:
    with uow.transaction() as session:
        # The order's row locked first (PostgreSQL; SQLite's write transaction is already alone):
        # a concurrent submission of the same key waits here, then finds the row written below.
        locked = session.execute(select(Order.id).where(Order.id == order_id).with_for_update()).first()
        if locked is None:
            return OrderRefund(RefundOutcome.MISSING)
        earlier = _earlier(request_key)
        if earlier is not None:
            return earlier
        order = order_store.read(order_id, fresh=True)
        assert order is not None  # its row is locked above

        def refused(why: str, **facts) -> OrderRefund:
            return OrderRefund(RefundOutcome.REFUSED, why, status=order.status, **facts)

        unpaid = _unpaid(order)
        if unpaid is not None:
            return refused(unpaid)
        why, amount, left = _refusal(order, amount, reason, restock)
        if why is not None:
            return refused(why, amount=amount, left=left)
        wanted = all_left(order_id) if restock is True else restock or {}
        if restock is True and not wanted:
            return refused("already_restocked", amount=amount, left=left)
        refund = record_operator_refund(
            order,
            amount=amount,
            reason=reason,
            request_key=request_key,
            operator=operator,
            restock=bool(wanted),
            now=now,
        )
        # In this transaction: a refused restock raises, and the refund above rolls back with it.
        given = tuple(restock_lines(order, refund.id, wanted, now))
        return OrderRefund(
            RefundOutcome.DONE,
            refund_id=refund.id,
            amount=amount,
            left=left - amount,
            restocked=bool(given),
            restock_words="; ".join(g.words() for g in given),
            given=given,
        )
