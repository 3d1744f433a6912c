"""The bench's own app: the shop plus bench-only routes, which the shop itself never has.

    gunicorn --pythonpath bench 'benchapp:create_bench_app()'   (bench/checkout.py, bench/webhook.py)

`POST /_bench/bare-order?variants=1,2,3` runs only the SQL of an order, the way place_order
issues it: read the prices, insert the order and its lines (the order store's insert_order),
then decrement each variant last, in ascending id order, and commit. No session, cart, CSRF,
outbox, deadline, Redis or provider:
bench/checkout.py divides the real checkout's throughput by this one's to show the overhead.

`POST /_bench/bare-webhook` is the floor for bench/webhook.py: it verifies the Stripe signature
on the raw body (same secret lookup and verification as POST /webhooks/stripe) and inserts one
row, nothing else (no dedup, no order, no outbox, no Redis).
"""

from __future__ import annotations

import secrets

from flask import Blueprint, request
from sqlalchemy import bindparam, insert, select

from shop import create_app
from shop.domain.deadlines import utcnow
from shop.extensions import csrf, db
from shop.models import Variant
from shop.orders import checkout
from shop.orders.checkout import new_reference
from shop.store import order_store

bp = Blueprint("benchsupport", __name__, url_prefix="/_bench")


_variants = Variant.__table__
_READ_PRICES = select(_variants.c.id, _variants.c.sku, _variants.c.name, _variants.c.price, _variants.c.currency).where(
    _variants.c.id.in_(bindparam("ids", expanding=True))
)


@bp.post("/bare-order")
def bare_order():
    """The same prebuilt statements place_order executes, nothing else."""
    ids = sorted({int(v) for v in request.args.get("variants", "").split(",") if v.strip()})
    now = utcnow()
    session = db.session
    variants = {v.id: v for v in session.execute(_READ_PRICES, {"ids": ids})}
    total = sum(v.price for v in variants.values())
    order_id = order_store.insert_order(
        session,
        reference=new_reference(),
        access_token=secrets.token_urlsafe(24),
        browser_id="bench",
        email="bench@example.com",
        total=total,
        currency="usd",
        now=now,
        lines=[
            dict(variant_id=v.id, sku=v.sku, name=v.name, quantity=1, unit_price=v.price) for v in variants.values()
        ],
    )
    for variant_id in ids:
        if session.execute(checkout._DECREMENT, dict(variant=variant_id, quantity=1, now=now)).rowcount != 1:
            session.rollback()
            return {"error": "out of stock"}, 409
    session.commit()
    return {"order_id": order_id}, 201


@bp.post("/bare-webhook")
def bare_webhook():
    from shop.models import WebhookReceipt
    from shop.provider import gateway
    from shop.provider.registration import webhook_secret
    from shop.provider.signature import verify_webhook

    body = request.get_data()
    try:
        event = verify_webhook(body, request.headers.get("Stripe-Signature"), webhook_secret() or "")
    except (gateway.SignatureProblem, ValueError):
        return {"error": "bad signature"}, 400
    db.session.execute(
        insert(WebhookReceipt).values(
            event_id=str(event.get("id"))[:255],
            event_type=str(event.get("type"))[:100],
            outcome="bench",
            reason="",
            http_status=200,
            received_at=utcnow(),
        )
    )
    db.session.commit()
    return {"received": True}, 200


def create_bench_app(test_config: dict | None = None):
    """`create_app` with the bench routes (CSRF-exempt: they are called without a form)."""
    app = create_app(test_config)
    csrf.exempt(bp)
    app.register_blueprint(bp)
    return app
