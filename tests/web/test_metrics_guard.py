"""What /metrics costs and who may read it (docs/REFERENCE.md, Operations: `GET /metrics`): one
process reuses a scrape for METRICS_CACHE_SECONDS, so scrapes in a row run the database's
aggregates once; a shop on a public address without METRICS_TOKEN refuses it in words unless
METRICS_PUBLIC opens it; the demo (`flask shop up`) keeps it open."""

from __future__ import annotations

from sqlalchemy import event

from shop.extensions import db
from support import FakeClock

SCRAPE_TOKEN = "scrape-0123456789-abcdef"


def _statements_per_scrape(app, client, scrapes: int) -> list[int]:
    with app.app_context():
        engine = db.engine
    seen: list[str] = []

    def count(_conn, _cursor, statement, *_args):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        counts = []
        for _ in range(scrapes):
            before = len(seen)
            assert client.get("/metrics").status_code == 200
            counts.append(len(seen) - before)
        return counts
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_two_scrapes_in_a_row_run_the_database_aggregates_once(make_fresh_app):
    clock = FakeClock()
    app = make_fresh_app(METRICS_CACHE_SECONDS=5, CLOCK=clock)
    client = app.test_client()
    first, second = _statements_per_scrape(app, client, 2)
    assert first >= 5 and second == 0, (first, second)
    clock.advance(5)  # the scrape is reused for 5 s, then read afresh
    (third,) = _statements_per_scrape(app, client, 1)
    assert third == first


def test_a_shop_on_a_public_address_without_a_token_refuses_the_metrics_in_words(make_fresh_app):
    closed = make_fresh_app(PUBLIC_BASE_URL="https://shop.example").test_client().get("/metrics")
    assert closed.status_code == 403
    body = closed.get_data(as_text=True)
    assert "shop_" not in body and "METRICS_TOKEN" in body and "METRICS_PUBLIC=1" in body


def test_metrics_public_or_a_token_open_the_metrics_of_a_public_shop(make_fresh_app):
    opened = make_fresh_app(PUBLIC_BASE_URL="https://shop.example", METRICS_PUBLIC=True).test_client()
    assert "shop_orders_stuck" in opened.get("/metrics").get_data(as_text=True)
    tokened = make_fresh_app(PUBLIC_BASE_URL="https://shop.example", METRICS_TOKEN=SCRAPE_TOKEN).test_client()
    assert tokened.get("/metrics").status_code == 401
    assert tokened.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}).status_code == 200


def test_a_shop_on_this_machine_keeps_the_metrics_open(make_fresh_app):
    for base in ("http://127.0.0.1:5000", "http://localhost:8000", "http://[::1]:5000"):
        assert make_fresh_app(PUBLIC_BASE_URL=base).test_client().get("/metrics").status_code == 200, base


def test_the_demo_opens_the_metrics_whatever_its_public_address(tmp_path):
    from shop.devserver.plan import make_plan
    from shop.devserver.supervise import free_port
    from shop.settings import load_settings

    environ = {
        "BACKSTOP_INSTANCE_PATH": str(tmp_path / "instance"),
        "STRIPE_API_BASE": "http://127.0.0.1:9",
        "PUBLIC_BASE_URL": "https://demo.example",
    }
    plan = make_plan(free_port(), environ)
    assert load_settings(plan.env, str(tmp_path / "instance"), argv=["flask", "shop", "up"]).metrics_public
