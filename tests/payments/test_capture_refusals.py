"""A ship's capture that cannot go through (CAPTURE_MODE=dispatch; docs/REFERENCE.md, Order states
and Console: POST /console/orders/<ref>/ship), through the real paths: the console's ship, the
capture command run by the outbox's runner against the sandbox, signed lapse notices. A hold that
ended (refused capture, or its lapse notice while the capture waits) ends the order cancelled,
stock back once, customer told, never Paid, and an operator reads it as a dead letter naming the
order; any other refusal leaves the order to ship again or to cancel from the console."""

from __future__ import annotations

import pytest
import stripe

from factories import on_hand
from held_payments import held_order, payment_intent_of
from payment_helpers import JSON, Shopper, order_id, post_webhook, run_everything
from shop.domain.order import OrderStatus
from shop.extensions import db
from shop.models import CommandKind, Order, ScheduledCommand, WorkStatus
from shop.provider.transport import SANDBOX_API_KEY
from support import log_in, mails

LAPSE = "charge.expired"
CANCELED = "payment_intent.canceled"
WEEK_AND_A_DAY = 8 * 24 * 3600  # past the card's seven days


def _authorized(app, sandbox) -> tuple[Shopper, str, int, str]:
    """One held order: (the shopper, its reference, its id, its PaymentIntent)."""
    shopper, order, sid = held_order(app, sandbox)
    return shopper, order["reference"], order_id(app, order["reference"]), payment_intent_of(app, sid)


def _ship(app, ref: str):
    """The operator ships it from the console: the capture is asked for, not yet run."""
    client = app.test_client()
    token = log_in(app, client)
    r = client.post(f"/console/orders/{ref}/ship", data={"csrf_token": token}, headers=JSON)
    assert r.status_code == 200 and r.get_json()["capturing"] is True, r.get_data(as_text=True)
    return client, token


def _state(app, ref: str) -> dict:
    with app.app_context():
        o = db.session.query(Order).filter_by(reference=ref).one()
        [capture] = db.session.query(ScheduledCommand).filter_by(kind=CommandKind.CAPTURE_PAYMENT, order_id=o.id)
        found = {
            "status": o.status,
            "capture_requested_at": o.capture_requested_at,
            "shipped_at": o.shipped_at,
            "restored": o.inventory_restored,
            "capture": capture.status,
            "words": capture.last_error or "",
        }
        db.session.remove()
    return found


def _notices(sandbox, intent: str) -> dict[str, dict]:
    """The two notices the sandbox sent when the hold lapsed on its clock."""
    charge = [r["event"] for r in sandbox.events(LAPSE) if r["event"]["data"]["object"]["payment_intent"] == intent]
    ended = [r["event"] for r in sandbox.events(CANCELED) if r["event"]["data"]["object"]["id"] == intent]
    assert len(charge) == len(ended) == 1
    return {LAPSE: charge[0], CANCELED: ended[0]}


def test_a_capture_refused_because_the_hold_lapsed_cancels_the_order_once_and_tells_an_operator_in_words(
    dispatch_shop, sandbox, mail_folder
):
    shopper, ref, _oid, intent = _authorized(dispatch_shop, sandbox)
    sock = dispatch_shop.skus["SOCK-M"]
    before = on_hand(sock, dispatch_shop)
    console, _token = _ship(dispatch_shop, ref)
    sandbox.advance_clock(WEEK_AND_A_DAY)  # the hold lapses before the capture runs
    run_everything(dispatch_shop)
    assert "being shipped" not in console.get(f"/console/orders/{ref}").get_data(as_text=True)

    state = _state(dispatch_shop, ref)
    assert state["status"] is OrderStatus.CANCELLED and state["shipped_at"] is None and state["restored"]
    assert state["capture"] == WorkStatus.DEAD
    assert ref in state["words"] and "status of canceled" in state["words"]  # the order and the provider's answer
    assert "cancelled" in state["words"] and "Nothing was taken" in state["words"]
    assert on_hand(sock, dispatch_shop) == before + 1
    assert len(mails(mail_folder, "order_hold_ended")) == 1
    assert not sandbox.events("charge.captured")

    # The lapse's own notices, arriving after, change nothing: the stock came back once.
    for event in _notices(sandbox, intent).values():
        assert post_webhook(shopper.client, event).get_json()["outcome"] in ("noop", "duplicate")
    run_everything(dispatch_shop)
    assert on_hand(sock, dispatch_shop) == before + 1
    assert len(mails(mail_folder, "order_hold_ended")) == 1
    assert shopper.order(ref)["status"] == "Cancelled"


@pytest.mark.parametrize("first", [LAPSE, CANCELED])
def test_a_lapse_notice_while_the_capture_waits_cancels_the_order_and_the_capture_says_why(
    dispatch_shop, sandbox, mail_folder, first
):
    shopper, ref, _oid, intent = _authorized(dispatch_shop, sandbox)
    sock = dispatch_shop.skus["SOCK-M"]
    before = on_hand(sock, dispatch_shop)
    _ship(dispatch_shop, ref)
    sandbox.advance_clock(WEEK_AND_A_DAY)
    notices = _notices(sandbox, intent)
    assert post_webhook(shopper.client, notices[first]).get_json()["outcome"] == "cancelled"
    second = CANCELED if first == LAPSE else LAPSE
    assert post_webhook(shopper.client, notices[second]).get_json()["outcome"] == "noop"
    run_everything(dispatch_shop)  # the capture command runs after the notices

    state = _state(dispatch_shop, ref)
    assert state["status"] is OrderStatus.CANCELLED and state["shipped_at"] is None and state["restored"]
    assert state["capture"] == WorkStatus.DEAD and ref in state["words"] and "not shipped" in state["words"]
    assert on_hand(sock, dispatch_shop) == before + 1
    assert len(mails(mail_folder, "order_hold_ended")) == 1
    assert not sandbox.events("charge.captured")


def test_any_other_refused_capture_is_a_dead_letter_and_the_operator_can_then_cancel_the_order_voiding_its_hold(
    dispatch_shop, sandbox
):
    _shopper, ref, oid, intent = _authorized(dispatch_shop, sandbox)
    sock = dispatch_shop.skus["SOCK-M"]
    before = on_hand(sock, dispatch_shop)
    client, token = _ship(dispatch_shop, ref)
    # The capture's key was spent on another call: the provider refuses the capture, the hold stands.
    provider = stripe.StripeClient(SANDBOX_API_KEY, base_addresses={"api": sandbox.base_url})  # the shop's key
    with pytest.raises(stripe.InvalidRequestError):
        provider.v1.refunds.create(
            params={"payment_intent": intent}, options={"idempotency_key": f"capture-order-{oid}-{intent}"}
        )
    run_everything(dispatch_shop)

    state = _state(dispatch_shop, ref)
    assert state["status"] is OrderStatus.AUTHORIZED and state["capture"] == WorkStatus.DEAD
    assert ref in state["words"] and "Keys for idempotent requests" in state["words"]
    assert state["capture_requested_at"] is None  # no longer being shipped
    assert provider.v1.payment_intents.retrieve(intent).status == "requires_capture"

    form = {"csrf_token": token, "reason": "cannot capture"}
    r = client.post(f"/console/orders/{ref}/cancel", data=form, headers=JSON)
    assert r.status_code == 200 and r.get_json()["voided"] is True, r.get_data(as_text=True)
    run_everything(dispatch_shop)
    assert _state(dispatch_shop, ref)["status"] is OrderStatus.CANCELLED
    assert provider.v1.payment_intents.retrieve(intent).status == "canceled"
    assert on_hand(sock, dispatch_shop) == before + 1


def test_the_customers_page_says_an_order_being_captured_is_being_shipped_and_offers_no_cancel(dispatch_shop, sandbox):
    shopper, ref, _oid, _intent = _authorized(dispatch_shop, sandbox)
    page = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "you may cancel" in page and "Cancel order" in page  # held, not yet shipping
    assert shopper.order(ref)["fulfilment"]["status"] == "unfulfilled"

    _ship(dispatch_shop, ref)
    data = shopper.order(ref)
    # The JSON's fulfilment keeps its two values (unfulfilled until the capture ships it).
    assert (data["status"], data["fulfilment"]["status"]) == ("Authorized", "unfulfilled")
    page = shopper.client.get(f"/orders/{ref}").get_data(as_text=True)
    assert "being shipped" in page and "Being shipped" in page
    assert "may cancel" not in page and "Cancel order" not in page and "/cancel" not in page
