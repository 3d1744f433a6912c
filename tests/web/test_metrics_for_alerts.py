"""The metrics the alert rules (deploy/prometheus/alerts.yml) and the dashboard
(deploy/grafana/backstop.json) need beside the contract's: orders by status and placed, failed
refunds, rejected webhooks by kind of reason, how long the breaker has been away from closed,
and the settings the rules compare against (docs/REFERENCE.md, Operations)."""

from __future__ import annotations

import math
import time
from datetime import timedelta

from factories import force_order, place_order_for, seed_catalog_rows
from payment_helpers import JSON, WEBHOOK_SECRET, signature
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Refund, Variant, WebhookReceipt
from shop.ops.metrics import REJECTION_REASONS
from shop.provider import guard
from support import log_in, wait_until

from .test_ops import scrape


def _value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def test_orders_are_counted_by_every_status_and_placed_orders_only_grow(fresh_app):
    samples = scrape(fresh_app)
    assert {dict(key[1])["status"] for key in samples if key[0] == "shop_orders"} == {
        "PendingPayment",
        "PaymentInitiated",
        "Authorized",
        "Paid",
        "PaymentFailed",
        "Cancelled",
    }
    assert _value(samples, "shop_orders_placed_total") == 0
    with fresh_app.app_context():
        seed_catalog_rows()
        variant = db.session.query(Variant.id).first()[0]
        first = place_order_for({variant: 1}, email="a@example.com", browser="b-1")
        place_order_for({variant: 1}, email="b@example.com", browser="b-2")
        force_order(first.order_id, status="Paid")
        db.session.remove()
    samples = scrape(fresh_app)
    assert _value(samples, "shop_orders", status="Paid") == 1
    assert _value(samples, "shop_orders", status="PendingPayment") == 1
    assert _value(samples, "shop_orders", status="Cancelled") == 0
    assert _value(samples, "shop_orders_placed_total") == 2


def _failed_refund(app, *, failed_ago: timedelta, settled: bool = False, status: str = "failed") -> None:
    with app.app_context():
        seed_catalog_rows()
        variant = db.session.query(Variant.id).first()[0]
        placed = place_order_for({variant: 1}, email="late@example.com", browser=f"b-{time.monotonic_ns()}")
        now = utcnow()
        db.session.add(
            Refund(
                order_id=placed.order_id,
                session_id=f"cs_test_{time.monotonic_ns()}",
                amount=1400,
                currency="usd",
                reason="late money",
                status=status,
                failure_reason="expired_or_canceled_card" if status == "failed" else None,
                failed_at=now - failed_ago if status == "failed" else None,
                settled_at=now if settled else None,
                settled_by="op@example.com" if settled else None,
            )
        )
        db.session.commit()
        db.session.remove()


def test_failed_refunds_are_counted_as_the_dashboard_counts_them_and_aged_from_the_failure(fresh_app, fresh_client):
    samples = scrape(fresh_app)
    assert _value(samples, "shop_refunds_failed") == 0
    assert _value(samples, "shop_refunds_failed_oldest_age_seconds") == 0

    _failed_refund(fresh_app, failed_ago=timedelta(hours=1))
    _failed_refund(fresh_app, failed_ago=timedelta(hours=3), settled=True)  # dealt with outside the shop
    _failed_refund(fresh_app, failed_ago=timedelta(0), status="succeeded")  # the money went back

    samples = scrape(fresh_app)
    assert _value(samples, "shop_refunds_failed") == 1
    assert 3500 < _value(samples, "shop_refunds_failed_oldest_age_seconds") < 3700
    log_in(fresh_app, fresh_client)
    assert fresh_client.get("/console/", headers=JSON).get_json()["refunds_failed"] == 1


def _post(client, body: bytes, headers: dict):
    return client.post("/webhooks/stripe", data=body, headers={"Content-Type": "application/json", **headers})


def test_rejected_webhooks_are_counted_by_the_kind_of_their_reason(make_fresh_app):
    signed = make_fresh_app(STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET).test_client()
    body = b'{"id": "evt_1", "object": "event", "type": "checkout.session.completed", "data": {"object": {}}}'
    assert _post(signed, body, {}).status_code == 400
    assert _post(signed, body, {"Stripe-Signature": signature(body, "whsec_someone_else")}).status_code == 400
    assert _post(signed, body, {"Stripe-Signature": "nonsense"}).status_code == 400
    assert _post(signed, b"", {"Stripe-Signature": signature(b"")}).status_code == 400
    assert _post(signed, b"{not json", {"Stripe-Signature": signature(b"{not json")}).status_code == 400
    assert _post(signed, b"[1, 2]", {"Stripe-Signature": signature(b"[1, 2]")}).status_code == 400
    assert _post(signed, b'{"pad": "' + b"x" * 1_000_000 + b'"}', {}).status_code == 413
    unsigned = make_fresh_app(STRIPE_WEBHOOK_SECRET=None).test_client()
    assert _post(unsigned, body, {"Stripe-Signature": signature(body)}).status_code == 400

    samples = scrape(make_fresh_app())
    got = {reason: _value(samples, "shop_webhook_rejections", reason=reason) for reason in REJECTION_REASONS}
    assert got == {
        "no_secret": 1,
        "bad_signature": 2,  # a wrong secret, and a header that is no signature at all
        "no_signature": 1,
        "empty_body": 1,
        "unparseable": 2,  # not JSON, and JSON that is not an event
        "too_large": 1,
        "other": 0,
    }
    # Every rejection is one of them: the kinds add up to the outcome's count.
    assert sum(got.values()) == _value(samples, "shop_webhook_deliveries", outcome="rejected") == 8


def test_a_rejection_reason_counts_as_the_kind_its_sentence_starts_with(fresh_app):
    reasons = {
        "no signing secret configured": "no_secret",
        "bad signature or stale timestamp: Timestamp outside the tolerance zone (1764680000)": "bad_signature",
        "Bad signature or stale timestamp: No signatures found matching the expected signature": "bad_signature",
        "no Stripe-Signature header": "no_signature",
        "empty body": "empty_body",
        "unparseable body: not a Stripe event": "unparseable",
        "body over 1000000 bytes": "too_large",
        "something new": "other",
        "": "other",
    }
    with fresh_app.app_context():
        for reason in reasons:
            db.session.add(
                WebhookReceipt(event_id=None, event_type=None, outcome="rejected", reason=reason, http_status=400)
            )
        # Accepted ones are not rejections, whatever their reason says.
        db.session.add(
            WebhookReceipt(event_id="evt_ok", event_type="x", outcome="accepted", reason="empty body", http_status=200)
        )
        db.session.commit()
        db.session.remove()
    samples = scrape(fresh_app)
    expected = {kind: list(reasons.values()).count(kind) for kind in REJECTION_REASONS}
    assert {kind: _value(samples, "shop_webhook_rejections", reason=kind) for kind in REJECTION_REASONS} == expected


def test_the_breaker_counts_its_time_away_from_closed_through_half_open(fresh_app):
    with fresh_app.app_context():
        provider = guard.get()
        conn = provider.shared.connection()
        key = provider.breaker.key
    assert _value(scrape(fresh_app), "shop_provider_breaker_open_seconds") == 0

    conn.hset(key, mapping={"state": "open", "opened_at": str(time.time() - 400)})
    samples = scrape(fresh_app)
    assert _value(samples, "shop_provider_breaker_state", state="open") == 1
    assert 399 < _value(samples, "shop_provider_breaker_open_seconds") < 430

    # A failing probe makes it half-open for a moment: still the same outage, still counting.
    conn.hset(key, "state", "half_open")
    assert 399 < _value(scrape(fresh_app), "shop_provider_breaker_open_seconds") < 430

    conn.hset(key, "state", "closed")
    assert _value(scrape(fresh_app), "shop_provider_breaker_open_seconds") == 0


def test_the_settings_the_rules_compare_against_are_exported(make_fresh_app):
    samples = scrape(make_fresh_app(RECONCILIATION_INTERVAL_SECONDS=120, HEALTH_STALE_SECONDS=45))
    assert _value(samples, "shop_reconciliation_interval_seconds") == 120
    assert _value(samples, "shop_reconciliation_scheduled") == 1
    assert _value(samples, "shop_health_stale_seconds") == 45

    off = make_fresh_app(RECONCILIATION_ENABLED=False, UNPAID_ORDER_EXPIRY_ENABLED=False)
    assert _value(scrape(off), "shop_reconciliation_scheduled") == 0
    only_expiry = make_fresh_app(RECONCILIATION_ENABLED=False, UNPAID_ORDER_EXPIRY_ENABLED=True)
    assert _value(scrape(only_expiry), "shop_reconciliation_scheduled") == 1


def test_payments_for_unknown_orders_are_counted_by_what_became_of_them(fresh_app):
    from shop.models import UnknownPayment

    samples = scrape(fresh_app)
    assert _value(samples, "shop_unknown_payments", status="not_ours") == 0
    with fresh_app.app_context():
        for n, status in enumerate(["refunded", "refunded", "not_ours"]):
            db.session.add(UnknownPayment(session_id=f"cs_test_{n}", found_via="sweep", status=status, detail=""))
        db.session.commit()
    samples = scrape(fresh_app)
    assert _value(samples, "shop_unknown_payments", status="refunded") == 2
    assert _value(samples, "shop_unknown_payments", status="not_ours") == 1
    assert _value(samples, "shop_unknown_payments", status="refund_failed") == 0


def test_the_providers_undelivered_events_are_a_metric_only_while_the_watch_has_asked_lately(make_shop, sandbox):
    """What BackstopWebhooksUndelivered pages on: a wrong signing secret shows here, a scanner does not."""
    from payment_helpers import Shopper
    from shop.provider import watch

    app = make_shop(served=True, STRIPE_WEBHOOK_SECRET="whsec_not_the_endpoints_secret")
    assert math.isnan(_value(scrape(app), "shop_webhook_events_undelivered"))  # never asked: no evidence
    order = Shopper(app, app.skus).place()
    sandbox.set_outcome(order["payment"]["session_id"], "paid")

    def refused() -> bool:
        with app.app_context():
            n = db.session.query(WebhookReceipt).filter_by(outcome="rejected").count()
            db.session.remove()
        return n > 0

    wait_until(refused, what="the provider's delivery, refused for its signature")
    with app.app_context():
        watch.check_deliveries()
    assert _value(scrape(app), "shop_webhook_events_undelivered") >= 1
    with app.app_context():  # an answer from long ago (the watch stopped asking) is no evidence
        watch.check_deliveries(now=utcnow() - timedelta(seconds=4 * watch.DELIVERY_CHECK_SECONDS))
    assert math.isnan(_value(scrape(app), "shop_webhook_events_undelivered"))
