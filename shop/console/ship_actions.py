"""Shipping (docs/REFERENCE.md, Console): the paid orders waiting to be shipped, oldest payment
first, and the ship action (asked, then confirmed, then done once by
`orders.fulfilment.ship_order`): a second click, or a second operator, changes nothing."""

from __future__ import annotations

from flask import url_for
from sqlalchemy import select, text
from wtforms import HiddenField, StringField

from ..domain.deadlines import utcnow
from ..domain.order import OrderStatus
from ..domain.results import SubmissionOutcome
from ..domain.timestamps import iso
from ..extensions import db
from ..models import Order
from ..models.orders import TO_SHIP
from ..orders.fulfilment import ALREADY_SHIPPED, NOTHING_TO_SHIP, TRACKING_MAX, ship_order
from ..web.answers import respond
from . import audit
from .answers import done, find_order, no_order, of_order, problem
from .blueprint import bp
from .forms import ConsoleForm

TO_SHIP_SHOWN = 200

REFUSED_WORDS = {
    NOTHING_TO_SHIP: "Order {ref} has nothing to ship: everything in it is digital.",
    ALREADY_SHIPPED: "Order {ref} was already shipped; nothing changed.",
}


class ShipForm(ConsoleForm):
    tracking = StringField("Tracking number")
    next = HiddenField()


def _not_shippable(ref: str, status: OrderStatus, why: str) -> str:
    if why in REFUSED_WORDS:
        return REFUSED_WORDS[why].format(ref=ref)
    return f"Only a paid (or authorized) order can be shipped; order {ref} is {status.value}. Nothing changed."


def _shipped_json(order: Order) -> dict:
    return {"status": "shipped" if order.shipped_at else "unfulfilled", "shipped_at": iso(order.shipped_at),
            "tracking": order.tracking}  # fmt: skip


def to_ship_query():
    """The to-ship list's query: ix_orders_to_ship's own predicate and order, a scan of that index."""
    return select(Order).where(text(TO_SHIP)).order_by(Order.updated_at, Order.id).limit(TO_SHIP_SHOWN)


@bp.get("/shipping")
def to_ship():
    """The paid orders with goods to send and not yet shipped, the longest waiting first."""
    rows = db.session.execute(to_ship_query()).scalars()
    orders = [
        {"reference": o.reference, "email": o.email, "total": o.total, "currency": o.currency,
         "paid_at": iso(o.updated_at), "created_at": iso(o.created_at)}
        for o in rows
    ]  # fmt: skip
    return respond("console/to_ship.html", {"orders": orders, "limit": TO_SHIP_SHOWN})


@bp.get("/orders/<reference>/ship")
@of_order
def ship_form(order):
    """The confirmation step: what leaves, where to, and an optional tracking number. Nothing
    changes on a GET."""
    data = {
        "reference": order.reference,
        "status": order.status.value,
        "ships": bool(order.ships),
        "shipping": order.shipping_details,
        "lines": [{"sku": ln.sku, "name": ln.name, "quantity": ln.quantity} for ln in order.lines],
        "fulfilment": _shipped_json(order),
        "capturing": order.status == OrderStatus.AUTHORIZED and order.capture_requested_at is not None,
    }
    back = url_for("console.order_detail", reference=order.reference)
    return respond("console/ship_order.html", data, form=ShipForm(), back=back, tracking_max=TRACKING_MAX)


@bp.post("/orders/<reference>/ship")
def ship(reference):
    """Ship the order (optional `tracking`), once: a repeated submission answers that it was
    already shipped and changes nothing."""
    order = find_order(reference)
    form = ShipForm()
    tracking = " ".join((form.tracking.data or "").split()) or None
    audit.about(f"order {order.reference if order else reference}", order_id=order and order.id, reason=tracking)
    if order is None:
        return no_order(reference)
    ref, back = order.reference, url_for("console.order_detail", reference=order.reference)
    if tracking is not None and (len(tracking) > TRACKING_MAX or not tracking.isprintable()):
        return problem(
            400,
            f"A tracking number is at most {TRACKING_MAX} printable characters; leave it empty if there is none.",
            title="Check the tracking number",
            back=url_for("console.ship_form", reference=ref),
        )
    db.session.rollback()  # the use case reads the order afresh in its own transaction
    result = ship_order(order.id, tracking, utcnow())
    if result.outcome is SubmissionOutcome.MISSING:
        return no_order(reference)
    payload = {"reference": ref, "status": result.status and result.status.value}
    if result.outcome is SubmissionOutcome.REFUSED:
        assert result.status is not None, "a refusal names the order's state"
        words = _not_shippable(ref, result.status, result.why)
        return problem(409, words, title="Not shipped", back=back, reference=ref, order_status=result.status.value,
                       why=result.why)  # fmt: skip
    if result.capturing:
        return _capturing(ref, payload, back, already=result.outcome is SubmissionOutcome.ALREADY)
    fulfilment = {"status": "shipped", "shipped_at": iso(result.shipped_at), "tracking": result.tracking}
    if result.outcome is SubmissionOutcome.ALREADY:
        message = f"Order {ref} was already shipped on {result.shipped_at:%Y-%m-%d %H:%M} UTC; nothing changed."
        return done(
            message, {**payload, "fulfilment": fulfilment, "already": True, "capturing": False}, back, "warning"
        )
    with_tracking = f" with tracking number {tracking}" if tracking else ""
    message = f"Order {ref} shipped{with_tracking}; the customer is emailed."
    return done(message, {**payload, "fulfilment": fulfilment, "already": False, "capturing": False}, back)


def _capturing(ref: str, payload: dict, back: str, *, already: bool):
    """An Authorized order: shipped once the capture of its held payment goes through."""
    fulfilment = {"status": "unfulfilled", "shipped_at": None, "tracking": None}
    if already:
        message = f"Order {ref}'s payment is already being captured for its shipment; nothing more was asked."
    else:
        message = (
            f"Capturing order {ref}'s held payment: it is marked shipped, and the customer emailed, as soon as "
            "the provider takes it. A capture the provider refuses shows under dead letters."
        )
    body = {**payload, "fulfilment": fulfilment, "already": already, "capturing": True}
    return done(message, body, back, "warning" if already else "ok")
