"""Order emails are no free mailer (docs/REFERENCE.md, Security; saga.mail_caps): a place-then-
cancel loop aimed at a typed address stops producing emails after ORDER_EMAILS_PER_RECIPIENT in
an hour, and the orders of one client address after ORDER_EMAILS_PER_ADDRESS, while every order
is still placed and cancelled. A redelivery decides the same, and the next hour sends again."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from factories import force_order, place_order_for, seed_catalog_rows
from payment_helpers import Shopper, run_everything
from shop.domain.deadlines import utcnow
from shop.domain.order import CANCELLED_BY_CUSTOMER, OrderStatus
from shop.extensions import db
from shop.models import Order
from shop.saga.mail_caps import may_email
from support import mails

VICTIM = "victim@example.com"


def _place_and_cancel(shopper: Shopper, email: str) -> None:
    """One turn of the loop: a checkout for `email`, then its cancel, both through the storefront,
    each followed by the worker's deliveries (its email goes out meanwhile, as a worker sends it)."""
    assert shopper.checkout("NB-A6-DOT", 1, email=email).status_code == 303
    run_everything(shopper.app)
    order = shopper.latest()
    assert shopper.cancel(order["reference"], order["version"]).status_code == 200
    run_everything(shopper.app)


def _to(folder, address: str) -> list:
    sent = mails(folder, "order_placed") + mails(folder, "order_cancelled")
    return [m for m in sent if m["To"] == address]


def test_a_place_then_cancel_loop_at_a_typed_address_stops_emailing_it_at_the_cap(make_shop, mail_folder):
    shop = make_shop(ORDER_EMAILS_PER_RECIPIENT=4, ORDER_EMAILS_PER_ADDRESS=1000)
    for _ in range(5):  # a fresh browser (and client address) each turn: only the recipient is the same
        _place_and_cancel(Shopper(shop), VICTIM)

    run_everything(shop)
    run_everything(shop)  # redelivered events decide the same

    assert len(_to(mail_folder, VICTIM)) == 4  # two turns' placed and cancelled emails, then nothing
    with shop.app_context():
        cancelled = db.session.query(Order).filter(Order.status == OrderStatus.CANCELLED).count()
        db.session.remove()
    assert cancelled == 5  # the orders themselves went through
    Shopper(shop).checkout("NB-A6-DOT", 1, email="someone@example.com")
    run_everything(shop)
    assert len(_to(mail_folder, "someone@example.com")) == 1  # another recipient is not capped by it


def test_one_client_address_emailing_many_typed_addresses_stops_at_its_own_cap(make_shop, mail_folder):
    shop = make_shop(ORDER_EMAILS_PER_RECIPIENT=1000, ORDER_EMAILS_PER_ADDRESS=6)
    for n in range(5):  # the same address each turn, a fresh browser and a fresh victim
        shopper = Shopper(shop)
        shopper.client.environ_base["REMOTE_ADDR"] = "198.51.100.20"
        _place_and_cancel(shopper, f"victim{n}@example.com")

    run_everything(shop)

    sent = mails(mail_folder, "order_placed") + mails(mail_folder, "order_cancelled")
    assert len(sent) == 6


@pytest.mark.parametrize("hours_later, expected", [(0.5, 0), (1.01, 2)])
def test_the_recipient_cap_is_per_hour(make_shop, mail_folder, hours_later, expected):
    shop = make_shop(ORDER_EMAILS_PER_RECIPIENT=2, ORDER_EMAILS_PER_ADDRESS=1000)
    _place_and_cancel(Shopper(shop), VICTIM)
    run_everything(shop)
    assert len(_to(mail_folder, VICTIM)) == 2
    with shop.app_context():  # those two emails were sent `hours_later` ago
        shift = timedelta(hours=hours_later)
        for order in db.session.query(Order).all():
            force_order(order.id, created_at=order.created_at - shift, cancelled_at=order.cancelled_at - shift)
        db.session.remove()

    _place_and_cancel(Shopper(shop), VICTIM)
    run_everything(shop)

    assert len(_to(mail_folder, VICTIM)) == 2 + expected


def test_of_two_orders_placed_at_the_same_instant_the_later_one_counts_the_earlier(fresh_app):
    # Same created_at to the microsecond: the order ids break the tie, so one of the two is within a cap of 1, and
    # which one does not depend on the order the emails are decided in (nor does an order ever count itself).
    fresh_app.config.update(ORDER_EMAILS_PER_RECIPIENT=1, ORDER_EMAILS_PER_ADDRESS=1000)
    with fresh_app.app_context():
        seed_catalog_rows()
        at = utcnow().replace(microsecond=500)
        first, second = (place_order_for(email=VICTIM).order_id for _ in range(2))
        force_order(None, created_at=at)
        later, earlier = db.session.get(Order, second), db.session.get(Order, first)
        assert (may_email(later, at), may_email(earlier, at), may_email(later, at)) == (False, True, False)
        db.session.remove()


@pytest.fixture
def capped(fresh_app):
    """An app with a recipient cap of 1 and an address cap of 1, in its context, the catalog seeded."""
    fresh_app.config.update(ORDER_EMAILS_PER_RECIPIENT=1, ORDER_EMAILS_PER_ADDRESS=1)
    with fresh_app.app_context():
        seed_catalog_rows()
        yield fresh_app
        db.session.remove()


def _order(email: str, address: str | None, at) -> Order:
    order_id = place_order_for(email=email).order_id
    force_order(order_id, created_at=at, client_address=address)
    found = db.session.get(Order, order_id)
    assert found is not None
    return found


def test_an_email_exactly_an_hour_before_still_counts_and_a_later_order_never_does(capped):
    at = utcnow().replace(microsecond=0)
    later = _order(VICTIM, None, at + timedelta(seconds=5))  # placed after this one's event: an earlier id
    this = _order(VICTIM, None, at)
    assert may_email(this, at) is True  # the later order is not before it, whatever its id
    force_order(later.id, created_at=at - timedelta(hours=1))  # now exactly an hour before
    assert may_email(this, at) is False


def test_a_cancellation_that_sends_no_notice_is_not_counted(capped):
    at = utcnow().replace(microsecond=0)
    other = _order(VICTIM, None, at - timedelta(hours=2))  # placed long ago: only its cancel is in the hour
    this = _order(VICTIM, None, at)
    force_order(
        other.id, status=OrderStatus.CANCELLED, cancelled_at=at - timedelta(minutes=5), cancel_reason="duplicate"
    )
    assert may_email(this, at) is True
    force_order(other.id, cancel_reason=CANCELLED_BY_CUSTOMER)
    assert may_email(this, at) is False


def test_an_event_without_a_time_is_not_capped(capped):
    this = _order(VICTIM, None, utcnow())
    _order(VICTIM, None, utcnow() - timedelta(minutes=1))
    assert may_email(this, None) is True


@pytest.mark.parametrize("address, cap", [(None, "recipient"), ("198.51.100.7", "client address")])
def test_an_email_left_out_is_logged_with_the_order_and_the_cap_that_stopped_it(capped, caplog, address, cap):
    at = utcnow().replace(microsecond=0)
    recipients = (VICTIM, VICTIM) if cap == "recipient" else ("one@example.com", "two@example.com")
    _order(recipients[0], address, at - timedelta(minutes=1))
    this = _order(recipients[1], address, at)
    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        assert may_email(this, at) is False
    said = f"order {this.reference}: email left out, its {cap} had 1 order emails this hour"
    assert [r.getMessage() for r in caplog.records if r.name == "shop.saga"] == [said]
