"""The order-placed email (docs/REFERENCE.md, Emails): every checkout's OrderPlaced event has a
delivery that emails the customer the order's private link, through the outbox like the other
emails: at least once, a redelivery replacing the message under its name instead of adding one;
not sent once the order is paid or cancelled (their own emails carry the link), and listed among
the order's emails in the console."""

from __future__ import annotations

import email

import pytest
from sqlalchemy import select

from compensation_support import cancel
from factories import force_order, place_order_for, seed_catalog_rows
from shop.domain.deadlines import utcnow
from shop.domain.events import OrderCancelled, OrderPaid, OrderPlaced, OrderShipped
from shop.domain.order import CANCELLED_BY_CUSTOMER
from shop.extensions import db
from shop.models import OutboxDelivery
from shop.outbox.dispatch import run_delivery
from shop.saga.email_resends import sent_emails
from shop.saga.notifications import (
    send_cancellation_email,
    send_order_confirmation,
    send_order_placed_email,
    send_shipment_email,
)


@pytest.fixture
def app(fresh_app, tmp_path):
    """Mail written as files (no SMTP_URL) in this test's own folder."""
    fresh_app.instance_path = str(tmp_path)
    assert not fresh_app.config.get("SMTP_URL")
    with fresh_app.app_context():
        seed_catalog_rows()
        yield fresh_app
        db.session.remove()


def _placed_email_delivery(order_id: int) -> OutboxDelivery:
    return db.session.execute(
        select(OutboxDelivery).where(
            OutboxDelivery.order_id == order_id, OutboxDelivery.handler == "send_order_placed_email"
        )
    ).scalar_one()


def _mails(app, tmp_path) -> list[str]:
    folder = tmp_path / "mail"
    return sorted(p.name for p in folder.glob("*.eml")) if folder.is_dir() else []


def test_checkout_emails_the_customer_the_orders_private_link_once(app, tmp_path):
    placed = place_order_for()
    delivery = _placed_email_delivery(placed.order_id)
    assert delivery.status == "pending"  # written by the checkout's own transaction

    assert run_delivery(delivery.id) == "done"

    name = f"{placed.reference}-order_placed-event.eml"
    assert _mails(app, tmp_path) == [name]
    message = email.message_from_bytes((tmp_path / "mail" / name).read_bytes())
    assert message["To"] == placed.email
    assert message["Subject"] == f"Your order {placed.reference}: here is its private link"
    body = message.get_payload(decode=True).decode()
    link = next(line for line in body.splitlines() if f"/orders/{placed.reference}?token=" in line).strip()
    assert link.endswith(f"token={placed.access_token}")
    # The link opens the order for whoever holds the email, in any browser.
    answer = app.test_client().get(
        f"/orders/{placed.reference}?token={placed.access_token}", headers={"Accept": "application/json"}
    )
    assert answer.status_code == 200 and answer.get_json()["status"] == "PendingPayment"

    # Delivered again (at least once): the same message under the same name, not a second one.
    send_order_placed_email(OrderPlaced(placed.order_id, placed.reference, placed.total, placed.currency), utcnow())
    assert _mails(app, tmp_path) == [name]
    assert [e.template for e in sent_emails(placed.order_id)] == ["order_placed"]


@pytest.mark.parametrize("status", ["Paid", "Cancelled"])
def test_an_order_paid_or_cancelled_before_its_email_went_is_not_told_it_waits_for_payment(app, tmp_path, status):
    placed = place_order_for()
    force_order(placed.order_id, status=status)

    assert run_delivery(_placed_email_delivery(placed.order_id).id) == "done"

    assert _mails(app, tmp_path) == []


def test_the_console_does_not_list_an_order_placed_email_that_went_after_a_cancel_as_sent(app, tmp_path):
    placed = place_order_for()
    cancel(placed.order_id)  # the customer's own cancel, before the worker ran the email

    assert run_delivery(_placed_email_delivery(placed.order_id).id) == "done"

    assert not any(name.endswith("-order_placed-event.eml") for name in _mails(app, tmp_path))
    assert "order_placed" not in [e.template for e in sent_emails(placed.order_id)]


def test_a_shipped_order_is_emailed_its_tracking_number_under_the_events_own_name(app, tmp_path):
    # The shipment notice (saga.notifications.send_shipment_email) rides the same event delivery path.
    placed = place_order_for()
    force_order(placed.order_id, status="Paid", shipped_at=utcnow(), tracking="1Z999AA10123456784")

    send_shipment_email(OrderShipped(placed.order_id, "1Z999AA10123456784"), utcnow())

    name = f"{placed.reference}-order_shipped-event.eml"
    assert _mails(app, tmp_path) == [name]
    message = email.message_from_bytes((tmp_path / "mail" / name).read_bytes())
    assert (message["To"], message["Subject"]) == (placed.email, f"Order {placed.reference} is on its way")
    assert "Tracking number: 1Z999AA10123456784" in message.get_payload(decode=True).decode()


def test_a_paid_order_is_emailed_its_receipt_under_the_events_own_name(app, tmp_path):
    """The confirmation (saga.notifications.send_order_confirmation): a redelivery of OrderPaid
    replaces the message under the same name instead of sending another."""
    placed = place_order_for()
    force_order(placed.order_id, status="Paid")
    paid = OrderPaid(placed.order_id, "cs_test_paid", placed.total, placed.currency)

    send_order_confirmation(paid, utcnow())
    send_order_confirmation(paid, utcnow())

    name = f"{placed.reference}-order_paid-event.eml"
    assert _mails(app, tmp_path) == [name]
    message = email.message_from_bytes((tmp_path / "mail" / name).read_bytes())
    assert message["To"] == placed.email and placed.reference in message["Subject"]


def test_a_customers_cancel_is_emailed_under_the_events_own_name(app, tmp_path):
    placed = place_order_for()
    cancel(placed.order_id)
    cancelled = OrderCancelled(placed.order_id, CANCELLED_BY_CUSTOMER)

    send_cancellation_email(cancelled, utcnow())
    send_cancellation_email(cancelled, utcnow())

    assert f"{placed.reference}-order_cancelled-event.eml" in _mails(app, tmp_path)
    assert not any("order_cancelled" in name and not name.endswith("-event.eml") for name in _mails(app, tmp_path))
