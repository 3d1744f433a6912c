"""Bench-only routes, registered only when BACKSTOP_BENCH_ENDPOINTS=1 (never in production).

`POST /_bench/bare-order?variants=1,2,3` runs only the SQL of an order, the way place_order
issues it: read the prices, insert the order and its lines, then decrement each variant last,
in ascending id order, and commit. No session, cart, CSRF, outbox, deadline, Redis or provider:
bench/checkout.py divides the real checkout's throughput by this one's to show the overhead.

`POST /_bench/bare-webhook` is the floor for bench/webhook.py: it verifies the Stripe signature
on the raw body (same secret lookup and verification as POST /webhooks/stripe) and inserts one
row, nothing else (no dedup, no order, no outbox, no Redis).
"""
from __future__ import annotations

import secrets

from flask import Blueprint, request
from sqlalchemy import insert, select, update

from .domain.deadlines import utcnow
from .domain.order import OrderStatus
from .extensions import csrf, db
from .models import InventoryItem, Order, OrderLine, Variant
from .orders.checkout import new_reference

bp = Blueprint("benchsupport", __name__, url_prefix="/_bench")


@bp.post("/bare-order")
def bare_order():
    ids = sorted({int(v) for v in request.args.get("variants", "").split(",") if v.strip()})
    now = utcnow()
    session = db.session
    variants = {v.id: v for v in session.execute(
        select(Variant.id, Variant.sku, Variant.name, Variant.price, Variant.currency).where(Variant.id.in_(ids)))}
    total = sum(v.price for v in variants.values())
    order_id = session.execute(insert(Order).values(
        reference=new_reference(), access_token=secrets.token_urlsafe(24), browser_id="bench",
        email="bench@example.com", status=OrderStatus.PENDING_PAYMENT.value, total=total, currency="usd",
        inventory_restored=False, payment_attempts=0, version=1, created_at=now, updated_at=now,
    ).returning(Order.id)).scalar_one()
    session.execute(insert(OrderLine), [
        dict(order_id=order_id, variant_id=v.id, sku=v.sku, name=v.name, quantity=1, unit_price=v.price)
        for v in variants.values()])
    for variant_id in ids:
        taken = session.execute(
            update(InventoryItem).where(InventoryItem.variant_id == variant_id, InventoryItem.on_hand >= 1)
            .values(on_hand=InventoryItem.on_hand - 1, updated_at=now).execution_options(synchronize_session=False))
        if taken.rowcount != 1:
            session.rollback()
            return {"error": "out of stock"}, 409
    session.commit()
    return {"order_id": order_id}, 201


@bp.post("/bare-webhook")
def bare_webhook():
    from .models import WebhookReceipt
    from .payments import gateway
    from .webhooks import webhook_secret

    body = request.get_data()
    try:
        event = gateway.verify_webhook(body, request.headers.get("Stripe-Signature"), webhook_secret() or "")
    except (gateway.SignatureProblem, ValueError):
        return {"error": "bad signature"}, 400
    db.session.execute(insert(WebhookReceipt).values(
        event_id=str(event.get("id"))[:255], event_type=str(event.get("type"))[:100], outcome="bench",
        reason="", http_status=200, received_at=utcnow()))
    db.session.commit()
    return {"received": True}, 200


def init_app(app) -> None:
    csrf.exempt(bp)
    app.register_blueprint(bp)
