"""A held payment that lapsed at the provider (CAPTURE_MODE=dispatch; docs/REFERENCE.md, Webhook):
`charge.expired` ends an Authorized order exactly as `payment_intent.canceled` does (cancelled,
stock back once, the customer told once), whichever of the two comes first, both, or repeated."""

from __future__ import annotations

import json

import pytest

from factories import on_hand
from held_payments import held_order, payment_intent_of
from payment_helpers import Shopper, post_webhook, run_everything
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import Order, Refund
from shop.payments.replay import reapply_event
from support import mails

LAPSE = "charge.expired"
CANCELED = "payment_intent.canceled"


def authorized_order(app, sandbox) -> tuple[Shopper, dict, str]:
    """One held order: (the shopper, the order's JSON, its PaymentIntent)."""
    shopper, order, sid = held_order(app, sandbox)
    return shopper, order, payment_intent_of(app, sid)


def lapse_notices(sandbox, intent: str) -> dict[str, dict]:
    """The sandbox lets the hold lapse on its clock: the two notices it sent for this payment."""
    sandbox.advance_clock(8 * 24 * 3600)  # past the card's seven days
    charge = [r["event"] for r in sandbox.events(LAPSE) if r["event"]["data"]["object"]["payment_intent"] == intent]
    ended = [r["event"] for r in sandbox.events(CANCELED) if r["event"]["data"]["object"]["id"] == intent]
    assert len(charge) == len(ended) == 1
    return {LAPSE: charge[0], CANCELED: ended[0]}


def status_of(app, reference: str) -> OrderStatus:
    with app.app_context():
        status = db.session.query(Order.status).filter_by(reference=reference).scalar()
        db.session.remove()
    return status


def test_a_lapsed_charge_alone_ends_the_authorized_order_as_the_deadline_would(dispatch_shop, sandbox, mail_folder):
    shopper, order, intent = authorized_order(dispatch_shop, sandbox)
    sock = dispatch_shop.skus["SOCK-M"]
    before = on_hand(sock, dispatch_shop)
    notices = lapse_notices(sandbox, intent)
    r = post_webhook(shopper.client, notices[LAPSE])
    assert r.status_code == 200 and r.get_json()["outcome"] == "cancelled", r.get_json()
    run_everything(dispatch_shop)
    assert status_of(dispatch_shop, order["reference"]) is OrderStatus.CANCELLED
    assert on_hand(sock, dispatch_shop) == before + 1
    assert len(mails(mail_folder, "order_hold_ended")) == 1
    with dispatch_shop.app_context():
        assert db.session.query(Refund).count() == 0  # nothing was taken: nothing goes back
        db.session.remove()


@pytest.mark.parametrize("first", [LAPSE, CANCELED])
def test_both_notices_of_one_lapse_in_either_order_and_repeated_end_the_order_once(
    dispatch_shop, sandbox, mail_folder, first
):
    shopper, order, intent = authorized_order(dispatch_shop, sandbox)
    sock = dispatch_shop.skus["SOCK-M"]
    before = on_hand(sock, dispatch_shop)
    notices = lapse_notices(sandbox, intent)
    second = CANCELED if first == LAPSE else LAPSE
    outcomes = [
        post_webhook(shopper.client, notices[kind]).get_json()["outcome"] for kind in (first, second, first, second)
    ]
    assert outcomes == ["cancelled", "noop", "noop", "noop"], outcomes
    run_everything(dispatch_shop)
    run_everything(dispatch_shop)
    assert status_of(dispatch_shop, order["reference"]) is OrderStatus.CANCELLED
    assert on_hand(sock, dispatch_shop) == before + 1
    assert len(mails(mail_folder, "order_hold_ended")) == 1


@pytest.mark.parametrize("kind", [LAPSE, CANCELED])
def test_an_operators_reapply_of_a_lapse_notice_ends_the_order_as_the_webhook_does(dispatch_shop, sandbox, kind):
    _shopper, order, intent = authorized_order(dispatch_shop, sandbox)
    body = json.dumps(lapse_notices(sandbox, intent)[kind])
    with dispatch_shop.app_context():
        first, again = reapply_event(body), reapply_event(body)
        db.session.remove()
    assert (first.outcome, again.outcome) == ("cancelled", "noop"), (first, again)
    assert status_of(dispatch_shop, order["reference"]) is OrderStatus.CANCELLED
