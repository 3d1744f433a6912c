"""What the public webhook endpoint keeps of noise (shop/web/webhook_noise.py; docs/REFERENCE.md,
Webhook): deliveries that fail the signature check are written at most so many a minute per client
address (past it: 429, nothing written) and at most so many in all (the oldest trimmed), what is
dropped is counted for /metrics and the console, and a signed delivery is never throttled."""

from __future__ import annotations

import json

from sqlalchemy import func, select

from payment_helpers import JSON, WEBHOOK_SECRET, signature, stripe_event
from shop.extensions import db
from shop.models import WebhookReceipt
from support import FakeClock, log_in

ATTACKER = "203.0.113.9"
FORGED = json.dumps(stripe_event("checkout.session.completed", {"id": "cs_x"}, "evt_forged")).encode()


def _noise(client, address: str):
    headers = {"Content-Type": "application/json", "Stripe-Signature": signature(FORGED, "whsec_not_this_shops")}
    return client.post("/webhooks/stripe", data=FORGED, headers=headers, environ_base={"REMOTE_ADDR": address})


def _kept(app) -> list[tuple[str | None, bool | None]]:
    with app.app_context():
        rows = db.session.execute(
            select(WebhookReceipt.source_address, WebhookReceipt.signed).order_by(WebhookReceipt.id)
        ).all()
        return [tuple(row) for row in rows]


def _noise_app(make_fresh_app, **limits):
    return make_fresh_app(STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET, CLOCK=FakeClock(), **limits)


def test_noise_past_an_addresss_limit_is_answered_429_not_written_and_counted(make_fresh_app):
    app = _noise_app(make_fresh_app, WEBHOOK_NOISE_PER_MINUTE=5)
    client = app.test_client()
    answers = [_noise(client, ATTACKER).status_code for _ in range(8)]
    assert answers == [400] * 5 + [429] * 3
    assert "not signed with this shop's secret" in _noise(client, ATTACKER).get_json()["error"]
    assert _noise(client, "198.51.100.7").status_code == 400  # another address has its own budget
    assert _kept(app) == [(ATTACKER, False)] * 5 + [("198.51.100.7", False)]
    scrape = client.get("/metrics").get_data(as_text=True)
    assert 'shop_webhook_noise_dropped_total{how="throttled"} 4.0' in scrape
    console = app.test_client()
    log_in(app, console)
    board = console.get("/console/", headers=JSON).get_json()
    noise = next(c for c in board["cards"] if c["key"] == "rejected_webhooks")["noise"]
    assert noise["dropped"] == {"throttled": 4, "trimmed": 0}


def test_a_signed_delivery_from_a_throttled_address_is_never_throttled(make_fresh_app):
    app = _noise_app(make_fresh_app, WEBHOOK_NOISE_PER_MINUTE=2)
    client = app.test_client()
    assert [_noise(client, ATTACKER).status_code for _ in range(3)] == [400, 400, 429]
    # A type the shop does not use (recorded as ignored), signed, from the address being throttled.
    for n in range(3):
        body = json.dumps(stripe_event("customer.created", {"id": "cus_1"}, f"evt_signed_{n}")).encode()
        sent = {"Content-Type": "application/json", "Stripe-Signature": signature(body)}
        answer = client.post("/webhooks/stripe", data=body, headers=sent, environ_base={"REMOTE_ADDR": ATTACKER})
        assert answer.status_code == 200, answer.get_data(as_text=True)
    assert _kept(app).count((ATTACKER, True)) == 3


def test_the_noise_kept_is_capped_oldest_first_and_signed_receipts_are_never_trimmed(make_fresh_app):
    app = _noise_app(make_fresh_app, WEBHOOK_NOISE_KEPT=3, WEBHOOK_NOISE_TRIM_EVERY=1)
    client = app.test_client()
    body = json.dumps(stripe_event("customer.created", {"id": "cus_1"}, "evt_kept")).encode()
    signed = {"Content-Type": "application/json", "Stripe-Signature": signature(body)}
    assert client.post("/webhooks/stripe", data=body, headers=signed).status_code == 200
    addresses = [f"198.51.100.{n}" for n in range(1, 7)]
    for address in addresses:
        assert _noise(client, address).status_code == 400
    kept = _kept(app)
    assert kept[0][1] is True  # the provider's delivery, older than all the noise, stays
    assert [address for address, was_signed in kept if was_signed is False] == addresses[-3:]
    with app.app_context():
        noise = db.session.scalar(select(func.count()).where(WebhookReceipt.signed.is_(False)))
    assert noise == 3
    assert 'shop_webhook_noise_dropped_total{how="trimmed"} 3.0' in client.get("/metrics").get_data(as_text=True)
