"""Money the provider holds for a session that names no order this database knows.

A database restored from a backup is behind the provider: the sessions paid after the copy was
taken name orders the copy never had (or had without their session), and their webhooks may
already have been answered by the machine that was lost. Such money is never kept:

* found by the signed webhook (a paid session naming no order we know) or by the sweep's scan of
  the provider's completed payments (shop.scheduling.passes.unknown_money), through the one
  guarded path (`payments.apply`), which records it here, in the same transaction, with a durable
  `settle_unknown_payment` command;
* the command asks the provider about the session (a webhook's word is checked, not trusted) and
  applies the answer through the same path: an order that turns up after all is paid, or its
  late money refunded, as for any notice; money that still names no order is refunded, once (the
  Idempotency-Key names the session), if the session carries this shop's mark (shop.provider.mark):
  a payment of another integration sharing the provider account is left alone and shown to an
  operator instead;
* the refund is followed until the provider says it is done;
* money only held (CAPTURE_MODE=dispatch) is voided instead, never captured and refunded.

This module and `unknown_sighting.py` (which records a sighting, for `payments.apply`) are the
writers of `unknown_payments`. The settling sits above apply (it applies what the provider says);
the recording below it, so the two never import each other.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import func, select

from ..extensions import db
from ..models import CommandKind, UnknownPayment
from ..models import UnknownPaymentStatus as S
from ..outbox import schedule_command
from ..outbox.failures import PermanentFailure
from ..provider import gateway
from ..provider.mark import shop_mark
from . import holds
from .apply import Outcome, ask_and_apply

log = logging.getLogger("shop.payments")

# A refund the provider has not confirmed yet is asked about again after this, doubling up to an hour.
FIRST_RECHECK = timedelta(seconds=30)
LAST_RECHECK = timedelta(hours=1)


def settle_unknown_payment(row_id: int, now: datetime) -> datetime | None:
    """Runs as a scheduled command, in the runner's transaction; raising lets the runner retry with
    backoff, then dead-letter. A refund the provider has not confirmed yet is looked at again by
    a later command of the same kind, written in this transaction."""
    row = db.session.get(UnknownPayment, row_id, with_for_update=True)
    if row is None:
        return None
    if row.status == S.REFUND_PENDING and row.provider_refund_id:
        return _follow_refund(row, row.provider_refund_id, now)
    if row.status != S.CHECKING:
        return None
    answer = ask_and_apply(row.session_id, source="unknown payment check", now=now, in_transaction=True)
    view = answer.view
    held = holds.is_held(view)
    if view.payment_status != gateway.SessionPaymentStatus.PAID and not held:
        return _settle(row, S.NOT_PAID, f"the provider says the session is {view.status}, {view.payment_status}", now)
    applied = answer.applied
    if applied is not None and applied.outcome is not Outcome.UNKNOWN_ORDER:
        ref = applied.order.reference if applied.order is not None else "?"
        return _settle(
            row, S.APPLIED, f"order {ref}: {applied.outcome}" + (f" ({applied.detail})" * bool(applied.detail)), now
        )
    if not view.shop_mark or view.shop_mark != shop_mark():
        return _settle(
            row,
            S.NOT_OURS,
            "paid, but the session does not carry this shop's mark: another integration on the same provider "
            "account may own it, so it is not refunded automatically; check it at the provider",
            now,
        )
    intent = view.payment_intent or row.payment_intent_id
    if held and intent:
        return _void(row, intent, now)
    if not intent or not view.amount_total:
        raise LookupError(f"the provider names no payment to refund for session {row.session_id} yet")
    row.payment_intent_id, row.amount, row.currency = intent, view.amount_total, (view.currency or row.currency)
    try:
        refund = gateway.refund_unknown_payment(
            session_id=row.session_id, payment_intent=intent, amount=view.amount_total
        )
    except gateway.ProviderRefused as exc:
        if exc.code == "charge_already_refunded":
            return _settle(row, S.REFUNDED, f"the provider says the payment was already refunded: {exc}", now)
        raise PermanentFailure(f"the provider refused to refund session {row.session_id}: {exc}") from exc
    row.provider_refund_id = refund.id
    log.warning(
        "refunded %s %s paid through session %s for no order this shop knows", row.amount, row.currency, row.session_id
    )
    return _after_refund_status(row, refund.status, now)


def _void(row: UnknownPayment, intent: str, now: datetime) -> None:
    """Money only held for no order: the hold is released (holds.VOID_KEY, as for an order's void),
    never captured and refunded; one voided or lapsed already is settled the same."""
    try:
        gateway.void_payment(intent, holds.VOID_KEY.format(intent=intent))
    except gateway.ProviderRefused as exc:
        if gateway.retrieve_payment(intent).status != gateway.PaymentIntentStatus.CANCELED:
            raise PermanentFailure(f"the provider refused to void payment {intent} of {row.session_id}: {exc}") from exc
    row.payment_intent_id = intent
    log.warning("released the hold on payment %s (session %s) for no order this shop knows", intent, row.session_id)
    return _settle(row, S.VOIDED, f"only held, never taken: hold on {intent} released", now)


def _follow_refund(row: UnknownPayment, refund_id: str, now: datetime) -> datetime | None:
    refund = gateway.retrieve_refund(refund_id)
    return _after_refund_status(row, refund.status, now)


def _after_refund_status(row: UnknownPayment, status: str | None, now: datetime) -> datetime | None:
    if status == "succeeded":
        return _settle(row, S.REFUNDED, f"refund {row.provider_refund_id} succeeded", now)
    if status in ("failed", "canceled"):
        return _settle(row, S.REFUND_FAILED, f"refund {row.provider_refund_id} {status} at the provider", now)
    waited = now - row.created_at if row.created_at else FIRST_RECHECK
    _settle(row, S.REFUND_PENDING, f"refund {row.provider_refund_id} is {status or 'pending'} at the provider", now)
    due = now + min(LAST_RECHECK, max(FIRST_RECHECK, waited))
    schedule_command(
        db.session, CommandKind.SETTLE_UNKNOWN_PAYMENT, due, payload={"unknown_payment_id": row.id}, now=now
    )
    return None


def _settle(row: UnknownPayment, status: str, detail: str, now: datetime) -> None:
    row.status, row.detail, row.updated_at = status, detail[:1000], now
    log.info("unknown payment %s (session %s): %s: %s", row.id, row.session_id, status, detail)
    return None


def count() -> int:
    return db.session.execute(select(func.count()).select_from(UnknownPayment)).scalar_one()


def recent(limit: int = 50) -> list[UnknownPayment]:
    """The newest rows, for the console."""
    return list(db.session.execute(select(UnknownPayment).order_by(UnknownPayment.id.desc()).limit(limit)).scalars())
