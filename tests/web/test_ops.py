"""GET /healthz and GET /metrics (docs/REFERENCE.md, Operations): the names and labels a
Prometheus server scrapes, a Content-Type it can parse, values read from the database, and a
clear 503 rather than a 500 when a dependency is down."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from factories import force_order, place_order_for, seed_catalog_rows
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import RestoreWarning, Variant, WebhookReceipt
from support import leave_heartbeats

CONTRACT_METRICS = {
    "shop_orders_stuck": {"status"},
    "shop_orders_oldest_stuck_age_seconds": {"status"},
    "shop_outbox_deliveries": {"status"},
    "shop_outbox_oldest_pending_age_seconds": set(),
    "shop_restore_warnings_open": set(),
    "shop_reconciliation_last_success_timestamp_seconds": set(),
    "shop_webhook_deliveries": {"outcome"},
}
UNREACHABLE_DB = "postgresql+psycopg://postgres@127.0.0.1:9/nothing"


def scrape(app) -> dict:
    r = app.test_client().get("/metrics")
    assert r.status_code == 200
    # One charset, once: a second parameter of the same name makes strict scrapers refuse the page.
    assert r.headers["Content-Type"].lower().count("charset") == 1, r.headers["Content-Type"]
    assert r.headers["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.get_data(as_text=True))
        for s in family.samples
    }


def test_metrics_carry_every_contract_name_and_label_and_count_from_the_database(fresh_app):
    with fresh_app.app_context():
        seed_catalog_rows()
        placed = place_order_for({db.session.query(Variant.id).first()[0]: 1}, email="a@example.com", browser="b-1")
        # Unchanged for two hours: stuck (the stuck age is the 30-minute expiry window).
        force_order(placed.order_id, updated_at=utcnow() - timedelta(hours=2))
        db.session.add(RestoreWarning(order_id=placed.order_id, variant_id=1, quantity=1, reason="test"))
        db.session.add(
            WebhookReceipt(event_id=None, event_type=None, outcome="rejected", reason="bad signature", http_status=400)
        )
        db.session.commit()
        db.session.remove()
    samples = scrape(fresh_app)
    for name, labels in CONTRACT_METRICS.items():
        found = [key for key in samples if key[0] == name]
        assert found, name
        assert all({k for k, _ in key[1]} == labels for key in found), (name, found)
    assert samples[("shop_orders_stuck", (("status", "PendingPayment"),))] == 1
    assert 7000 < samples[("shop_orders_oldest_stuck_age_seconds", (("status", "PendingPayment"),))] < 7300
    assert samples[("shop_restore_warnings_open", ())] == 1
    assert samples[("shop_webhook_deliveries", (("outcome", "rejected"),))] == 1
    assert {dict(key[1])["status"] for key in samples if key[0] == "shop_outbox_deliveries"} == {
        "pending",
        "processing",
        "done",
        "dead",
        "discarded",
    }
    assert samples[("shop_outbox_deliveries", (("status", "dead"),))] == 0


def test_healthz_is_200_when_both_answer_and_503_naming_the_one_that_is_down(make_fresh_app):
    app = make_fresh_app()
    leave_heartbeats(app)
    up = app.test_client().get("/healthz")
    assert up.status_code == 200, up.get_json()
    body = up.get_json()
    assert (body["status"], body["database"], body["redis"], body["problems"]) == ("ok", "ok", "ok", [])
    assert body["workers"].startswith("ok") and body["scheduler"].startswith("ok") and body["outbox"].startswith("ok")
    no_redis = make_fresh_app(REDIS_URL="redis://127.0.0.1:9/0").test_client().get("/healthz")
    assert no_redis.status_code == 503 and no_redis.get_json()["redis"].startswith("down")
    assert no_redis.get_json()["database"] == "ok"
    no_db = make_fresh_app(DATABASE_URL=UNREACHABLE_DB).test_client().get("/healthz")
    assert no_db.status_code == 503 and no_db.get_json()["database"].startswith("down")


def test_metrics_with_the_database_down_is_a_503_in_words_not_a_500(make_fresh_app):
    r = make_fresh_app(DATABASE_URL=UNREACHABLE_DB).test_client().get("/metrics")
    assert r.status_code == 503 and "database unreachable" in r.get_data(as_text=True)


SCRAPE_TOKEN = "scrape-0123456789-abcdef"


def test_with_a_metrics_token_only_a_scraper_sending_it_gets_the_metrics(make_fresh_app):
    """METRICS_TOKEN (docs/REFERENCE.md, Settings): without it, or with anything else, a 401 that
    says how to authenticate and shows nothing of the shop."""
    client = make_fresh_app(METRICS_TOKEN=SCRAPE_TOKEN).test_client()
    refused = {
        "no header": client.get("/metrics"),
        "wrong token": client.get("/metrics", headers={"Authorization": "Bearer scrape-0123456789-abcdeX"}),
        "a prefix of it": client.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN[:-1]}"}),
        "Basic": client.get("/metrics", headers={"Authorization": f"Basic {SCRAPE_TOKEN}"}),
        "bare token": client.get("/metrics", headers={"Authorization": SCRAPE_TOKEN}),
        "not latin": client.get("/metrics", headers={"Authorization": "Bearer \u00e9\u00e9\u00e9"}),
    }
    for what, r in refused.items():
        assert r.status_code == 401, (what, r.status_code)
        assert r.headers["WWW-Authenticate"].startswith("Bearer"), what
        body = r.get_data(as_text=True)
        assert "shop_" not in body and "METRICS_TOKEN" in body, (what, body)
    right = client.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    assert right.status_code == 200 and "shop_orders_stuck" in right.get_data(as_text=True)
    assert right.headers["Content-Type"].startswith("text/plain")
    # The scheme is case-insensitive (RFC 7235); the health check stays open to the balancer.
    assert client.get("/metrics", headers={"Authorization": f"bearer {SCRAPE_TOKEN}"}).status_code == 200
    assert client.get("/healthz").status_code in (200, 503)


def test_without_a_metrics_token_the_metrics_stay_open(make_fresh_app):
    client = make_fresh_app(METRICS_TOKEN=None).test_client()
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer anything-at-all-here"}).status_code == 200
