"""Helpers shared by the outbox, compensation and worker-crash tests: the customer's cancel
through the real use case (orders come from factories.place_order_for), and fresh reads of
the rows."""

from __future__ import annotations

from sqlalchemy import select, update

from factories import on_hand, place_order_for
from shop.extensions import db
from shop.models import Order, OutboxDelivery, RestoreWarning
from shop.orders.cancel import cancel_order


def cancel(order_id: int) -> None:
    """The customer's cancel of a PendingPayment order (no provider involved)."""
    version = db.session.get(Order, order_id).version
    outcome = cancel_order(order_id, version)
    assert outcome.status == "cancelled", outcome
    db.session.remove()


def placed_and_cancelled(items: dict[int, int]) -> tuple[int, int]:
    """An order that is cancelled, with its pending restore_inventory delivery: (order, delivery)."""
    order_id = place_order_for(items).order_id
    cancel(order_id)
    return order_id, restore_delivery(order_id).id


def restore_delivery(order_id: int) -> OutboxDelivery:
    db.session.expire_all()
    return db.session.execute(
        select(OutboxDelivery).where(OutboxDelivery.order_id == order_id, OutboxDelivery.handler == "restore_inventory")
    ).scalar_one()


def stock(variant_ids) -> dict[int, int]:
    return {v: on_hand(v) for v in variant_ids}


def order(order_id: int) -> Order:
    db.session.expire_all()
    return db.session.get(Order, order_id)


def warnings(order_id: int) -> list[RestoreWarning]:
    db.session.expire_all()
    return list(
        db.session.execute(
            select(RestoreWarning).where(RestoreWarning.order_id == order_id).order_by(RestoreWarning.id)
        ).scalars()
    )


def cancel_in(app, order_id) -> int:
    """Cancel through the use case; returns the id of the restore_inventory delivery it wrote."""
    with app.app_context():
        assert cancel_order(order_id, None).status == "cancelled"
        return db.session.execute(
            select(OutboxDelivery.id).where(
                OutboxDelivery.order_id == order_id, OutboxDelivery.handler == "restore_inventory"
            )
        ).scalar_one()


def dead_letter(app, delivery_id, error="RuntimeError: handler crashed") -> None:
    """Make a real delivery a dead letter with its attempt budget spent."""
    with app.app_context():
        db.session.execute(
            update(OutboxDelivery)
            .where(OutboxDelivery.id == delivery_id)
            .values(
                status="dead",
                attempts=OutboxDelivery.max_attempts,
                last_error=error,
                last_traceback="Traceback (most recent call last):\n  ...\nRuntimeError: handler crashed\n",
            )
        )
        db.session.commit()
