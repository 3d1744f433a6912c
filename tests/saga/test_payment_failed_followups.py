"""A failed payment's follow-up (saga.notifications.payment_failed_followups): the customer's email
as a command of the order's (its attempt named), and, with unpaid orders expiring, a fresh full
payment window from the failure, never earlier than the order's last change. Through the
delivery's runner: tests/outbox/test_outbox.py."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import select

from factories import force_order, place_order_for, seed_catalog_rows
from shop import logs
from shop.domain.deadlines import as_utc, utcnow
from shop.domain.events import OrderPaymentFailed
from shop.extensions import db
from shop.models import ScheduledCommand
from shop.outbox import uow
from shop.saga.notifications import payment_failed_followups

WINDOW = 900


@pytest.fixture
def app(fresh_app):
    fresh_app.config.update(UNPAID_ORDER_EXPIRY_ENABLED=True, UNPAID_ORDER_EXPIRY_SECONDS=WINDOW)
    with fresh_app.app_context():
        seed_catalog_rows()
        yield fresh_app
        db.session.remove()


def _followed_up(order_id: int, now) -> list[tuple]:
    """(kind, order, payload, due) of each command the follow-up of a failure at `now` wrote."""
    with uow.transaction():
        payment_failed_followups(OrderPaymentFailed(order_id, "cs_test_1", "card_declined"), now)
    rows = db.session.execute(
        select(ScheduledCommand).where(ScheduledCommand.created_at == now).order_by(ScheduledCommand.id)
    ).scalars()
    return [(r.kind, r.order_id, r.payload, as_utc(r.next_attempt_at)) for r in rows]


def test_a_failed_payment_emails_the_customer_and_gives_a_full_window_from_the_failure(app, caplog):
    placed = place_order_for()
    order_id = placed.order_id
    force_order(order_id, payment_attempts=2, updated_at=utcnow() - timedelta(minutes=5))
    now = utcnow().replace(microsecond=0) + timedelta(seconds=1)

    with caplog.at_level(logging.INFO, logger="shop.saga"):
        assert _followed_up(order_id, now) == [
            ("send_email", order_id, {"template": "payment_failed", "attempt": 2}, now),
            ("expire_unpaid_order", order_id, {}, now + timedelta(seconds=WINDOW)),
        ]
    said = f"order {placed.reference}: payment failed (card_declined); customer notified and deadline re-armed"
    assert said in [r.getMessage() for r in caplog.records if r.name == "shop.saga"]


def test_the_fresh_window_starts_no_earlier_than_the_orders_last_change(app):
    order_id = place_order_for().order_id
    now = utcnow().replace(microsecond=0)
    changed = now + timedelta(seconds=30)  # the order changed after the failure's time (a clock behind)
    force_order(order_id, updated_at=changed)

    [_, deadline] = _followed_up(order_id, now)

    assert deadline == ("expire_unpaid_order", order_id, {}, changed + timedelta(seconds=WINDOW))


def test_without_expiry_only_the_email_is_scheduled_and_an_order_gone_gets_nothing(app):
    app.config["UNPAID_ORDER_EXPIRY_ENABLED"] = False
    order_id = place_order_for().order_id
    now = utcnow().replace(microsecond=0)

    assert [kind for kind, *_ in _followed_up(order_id, now)] == ["send_email"]
    assert _followed_up(order_id + 1000, now + timedelta(seconds=1)) == []


def test_the_lines_logged_after_the_followups_name_the_order_they_are_about(app):
    placed = place_order_for()
    with logs.scope(delivery_id=7):
        _followed_up(placed.order_id, utcnow())
        assert logs.current() == {"delivery_id": 7, "order_ref": placed.reference}
