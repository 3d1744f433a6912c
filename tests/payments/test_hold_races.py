"""A held payment's cancel racing its ship (docs/REFERENCE.md, Guarantees: a hold is captured at
most once, voided, not refunded, when an Authorized order is cancelled before it ships). The
interleaving the saga's model found (model/saga.pml, the seeded bug `ship_keeps_the_version`): a
cancel reads the order while it is Authorized and no capture is asked; a ship asks for the
capture and the capture takes the hold; then, before the capture's commit, the cancel saves. The
ship's ask moves the order's version, so that save loses its race and the cancel, read afresh,
is refused: the order is being shipped."""

from __future__ import annotations

import pytest

from held_payments import held_order
from payment_helpers import JSON, order_id, run_everything
from shop.domain.deadlines import utcnow
from shop.domain.order import CANCELLED_BY_CUSTOMER, OrderStatus
from shop.domain.results import SubmissionOutcome
from shop.extensions import db
from shop.models import CommandKind, Order, ScheduledCommand
from shop.orders.cancel import CancelStatus, cancel_authorized
from shop.orders.fulfilment import _capture_then_ship, ship_order
from shop.outbox import uow
from shop.payments.holds import BEING_SHIPPED, CAPTURE_KEY
from shop.provider import gateway
from shop.store import order_store
from shop.store.order_store import LostRace
from support import log_in


def test_a_ship_that_read_the_order_before_its_cancel_committed_captures_nothing_and_says_so(dispatch_shop, sandbox):
    """The other order of the two (found by bench/chaos.py --capture dispatch): the ship read the
    order Authorized, the cancel committed, then the ship asked for the capture. Its ask finds the
    order moved, the ship reads it afresh and refuses; it used to answer "capturing"."""
    app = dispatch_shop
    shopper, order, _sid = held_order(app, sandbox)
    oid = order_id(app, order["reference"])
    with app.app_context():
        seen = order_store.read(oid)  # the ship's read
        db.session.remove()
    assert seen is not None and seen.status is OrderStatus.AUTHORIZED
    assert shopper.cancel(order["reference"], order["version"]).status_code == 200
    with app.app_context():
        with pytest.raises(LostRace), uow.transaction():
            _capture_then_ship(seen, "1Z1", utcnow())  # the ship's ask, with what it read
        shipment = ship_order(oid, "1Z1", utcnow())  # ... and its retry, reading afresh
        captures = db.session.query(ScheduledCommand).filter_by(kind=CommandKind.CAPTURE_PAYMENT).count()
        db.session.remove()
    assert (shipment.outcome, shipment.status, shipment.capturing) == (
        SubmissionOutcome.REFUSED,
        OrderStatus.CANCELLED,
        False,
    )
    assert captures == 0


def test_a_cancel_that_read_the_order_before_its_ship_asked_the_capture_loses_and_the_hold_is_taken_once(
    dispatch_shop, sandbox
):
    app = dispatch_shop
    _shopper, placed, _sid = held_order(app, sandbox)
    sid, ref = placed["payment"]["session_id"], placed["reference"]
    oid = order_id(app, ref)
    with app.app_context():
        seen = order_store.read(oid)  # the cancel's look: Authorized, no capture asked yet
        db.session.remove()
    assert seen is not None and seen.status is OrderStatus.AUTHORIZED and seen.capture_requested_at is None

    operator = app.test_client()
    token = log_in(app, operator)
    shipped = operator.post(f"/console/orders/{ref}/ship", data={"csrf_token": token}, headers=JSON)
    assert shipped.status_code == 200 and shipped.get_json()["capturing"] is True, shipped.get_data(as_text=True)
    with app.app_context():
        # The capture command's first half: the hold taken under its key; its commit not yet made.
        pi = gateway.retrieve_session(sid).payment_intent
        assert pi is not None
        gateway.capture_payment(pi, None, CAPTURE_KEY.format(order=oid, intent=pi))
        outcome = cancel_authorized(seen, CANCELLED_BY_CUSTOMER)  # ... and the cancel saves what it read
        db.session.remove()
    assert outcome.status is CancelStatus.REFUSED and outcome.code == BEING_SHIPPED, outcome

    run_everything(app)  # the capture command, its key replayed: Paid and shipped
    with app.app_context():
        row = db.session.get(Order, oid)
        assert row is not None
        status, shipped_at = row.status, row.shipped_at
        voids = db.session.query(ScheduledCommand).filter_by(kind=CommandKind.VOID_PAYMENT).count()
        intent = gateway.retrieve_payment(pi)
        db.session.remove()
    assert (status, shipped_at is not None, voids) == (OrderStatus.PAID, True, 0)
    assert intent.status == gateway.PaymentIntentStatus.SUCCEEDED and intent.amount_received == placed["total"]
    assert len(sandbox.events("charge.captured")) == 1
