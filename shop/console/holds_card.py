"""The dashboard's card for held payments (CAPTURE_MODE=dispatch; docs/REFERENCE.md, Console):
Authorized orders whose hold lapses within AUTHORIZATION_WARNING_SECONDS and that no ship is
capturing yet. Shown only where holds exist: with CAPTURE_MODE=dispatch, or while an order is
Authorized."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import current_app, url_for
from sqlalchemy import func, select

from ..domain.deadlines import as_utc
from ..domain.order import OrderStatus
from ..domain.payment import CaptureMode
from ..extensions import db
from ..models import Order
from .format import human_age


def holds_cards(now: datetime, card) -> list[dict]:
    """`card`: board._card, the dashboard's one card shape. No card where nothing is held."""
    cfg = current_app.config
    authorized = Order.status == OrderStatus.AUTHORIZED
    if (
        cfg["CAPTURE_MODE"] != CaptureMode.DISPATCH
        and not db.session.execute(select(Order.id).where(authorized).limit(1)).first()
    ):
        return []
    horizon = now + timedelta(seconds=cfg["AUTHORIZATION_WARNING_SECONDS"])
    count, soonest = db.session.execute(
        select(func.count(), func.min(Order.hold_expires_at)).where(
            authorized, Order.capture_requested_at.is_(None), Order.hold_expires_at < horizon
        )
    ).one()
    margin = human_age(cfg["AUTHORIZATION_MARGIN_SECONDS"])
    words = (
        f"{count} held payment{'' if count == 1 else 's'} lapse within "
        f"{human_age(cfg['AUTHORIZATION_WARNING_SECONDS'])}, the first in "
        f"{human_age(max(0, int((as_utc(soonest) - now).total_seconds())))}."
        if count
        else "No held payment lapses soon."
    )
    check = (
        f"Ship them (the ship captures the payment) or cancel them; {margin} before a hold lapses an "
        "unshipped order is cancelled and its hold voided."
    )
    return [card("holds", "Held payments", count == 0, count, words, check, url_for("console.to_ship"),
                 condition=str(count))]  # fmt: skip
