"""A paid session that names no order this database knows, recorded with the command that settles
it (`payments.unknown_money.settle_unknown_payment`), in the caller's transaction: `payments.apply`
calls it when a notice or the sweep finds such money. Apart from the settling because the settling
applies the provider's answer through apply: each imports only what sits below it."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select

from ..extensions import db
from ..models import CommandKind, UnknownPayment
from ..models import UnknownPaymentStatus as S
from ..outbox import schedule_command
from ..provider import gateway
from .first_sighting import add_once

log = logging.getLogger("shop.payments")


def record_unknown_payment(view: gateway.SessionView, *, found_via: str, now: datetime) -> bool:
    """Record a paid session that names no order we know, with the command that settles it, in the
    caller's transaction. False when it was already recorded (a second sighting)."""
    session = db.session
    row = add_once(
        session,
        select(UnknownPayment.id).where(UnknownPayment.session_id == view.id),
        lambda: UnknownPayment(
            session_id=view.id,
            payment_intent_id=view.payment_intent,
            amount=view.amount_total,
            currency=(view.currency or "")[:3] or None,
            reference=(view.client_reference_id or "")[:255] or None,
            found_via=found_via[:40],
            status=S.CHECKING,
            detail="",
            created_at=now,
            updated_at=now,
        ),
    )
    if row is None:  # a second sighting, or a concurrent one won
        return False
    schedule_command(session, CommandKind.SETTLE_UNKNOWN_PAYMENT, now, payload={"unknown_payment_id": row.id}, now=now)
    log.warning(
        "provider session %s (via %s) took %s %s for no order this shop knows (ref %s); checking it with the provider",
        view.id,
        found_via,
        view.amount_total,
        view.currency,
        view.client_reference_id,
    )
    return True
