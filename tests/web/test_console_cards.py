"""The dashboard's cards (what needs a human, each green only when its own check passed recently),
its charts of the last hour, and a dead letter acted on staying in view with its new state."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import select, update

from compensation_support import cancel_in, dead_letter
from factories import placed_order_in
from payment_helpers import HTML, JSON
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import OutboxEvent, ReconciliationCycle, ScheduledCommand, WebhookReceipt


def card(data, key):
    return next(c for c in data["cards"] if c["key"] == key)


def test_a_rejected_webhook_turns_its_card_red_with_the_reason_and_what_to_check(fresh_app, fresh_client, token):
    data = fresh_client.get("/console/", headers=JSON).get_json()
    assert card(data, "rejected_webhooks")["ok"] is True and card(data, "rejected_webhooks")["count"] == 0
    with fresh_app.app_context():
        # One from two days ago is outside the card's 24 hours; the recent one counts.
        db.session.add(
            WebhookReceipt(
                event_id="evt_old",
                event_type="checkout.session.completed",
                outcome="rejected",
                reason="old",
                http_status=400,
                received_at=utcnow() - timedelta(days=2),
            )
        )
        db.session.add(
            WebhookReceipt(
                event_id=None,
                event_type=None,
                outcome="rejected",
                reason="signature does not match",
                http_status=400,
                received_at=utcnow() - timedelta(minutes=5),
            )
        )
        db.session.commit()
    data = fresh_client.get("/console/", headers=JSON).get_json()
    c = card(data, "rejected_webhooks")
    assert c["ok"] is False and c["count"] == 1
    assert c["latest_reason"] == "signature does not match" and "signature does not match" in c["words"]
    assert "STRIPE_WEBHOOK_SECRET" in c["check"] and "stripe-register-webhook" in c["check"]
    assert c["url"] == "/console/webhooks?outcome=rejected"
    assert data["stuck_orders"]["count"] == 0  # the keys that were there before stay

    html = fresh_client.get("/console/", headers=HTML).get_data(as_text=True)
    section = re.search(r'<section[^>]*data-card="rejected_webhooks".*?</section>', html, re.S).group(0)
    assert "tile alert" in section and "signature does not match" in section and "STRIPE_WEBHOOK_SECRET" in section


def test_a_webhook_refused_at_the_door_reaches_the_dashboard_json_with_its_reason(fresh_app, fresh_client, token):
    """End to end: a delivery whose signature does not verify, posted to the real endpoint."""
    body = b'{"id": "evt_forged", "type": "checkout.session.completed", "data": {"object": {}}}'
    r = fresh_app.test_client().post(
        "/webhooks/stripe", data=body, headers={"Content-Type": "application/json", "Stripe-Signature": "t=1,v1=forged"}
    )
    assert r.status_code == 400
    data = fresh_client.get("/console/", headers=JSON).get_json()
    c = card(data, "rejected_webhooks")
    assert c["ok"] is False and c["count"] == 1 and c["latest_reason"] and c["latest_reason"] in c["words"]
    assert c["latest_at"] and "STRIPE_WEBHOOK_SECRET" in c["check"]
    [listed] = fresh_client.get(c["url"], headers=JSON).get_json()["webhooks"]
    assert listed["outcome"] == "rejected" and listed["reason"] == c["latest_reason"]


def test_the_sweep_card_is_green_only_while_a_sweep_finished_ok_within_two_intervals(fresh_app, fresh_client, token):
    interval = fresh_app.config["RECONCILIATION_INTERVAL_SECONDS"]
    data = fresh_client.get("/console/", headers=JSON).get_json()
    assert card(data, "sweep")["ok"] is False and card(data, "sweep")["stale"] is True  # never swept

    long_ago = utcnow() - timedelta(seconds=3 * interval)
    with fresh_app.app_context():
        db.session.add(
            ReconciliationCycle(
                started_at=long_ago,
                finished_at=long_ago + timedelta(seconds=1),
                cutoff=long_ago,
                status="ok",
                expiry_counts={},
                provider_counts={},
            )
        )
        db.session.commit()
    # Its last word was "ok", but that was three intervals ago: not green.
    c = card(fresh_client.get("/console/", headers=JSON).get_json(), "sweep")
    assert c["ok"] is False and c["stale"] is True and "last good one finished" in c["words"]

    recent = utcnow() - timedelta(seconds=interval // 2)
    with fresh_app.app_context():
        db.session.add(
            ReconciliationCycle(
                started_at=recent, finished_at=recent, cutoff=recent, status="ok", expiry_counts={}, provider_counts={}
            )
        )
        db.session.commit()
    c = card(fresh_client.get("/console/", headers=JSON).get_json(), "sweep")
    assert c["ok"] is True and c["stale"] is False


def test_the_processes_card_is_not_green_without_a_beating_worker_and_scheduler(fresh_app, fresh_client, token):
    # No process has beaten in this test's Redis db: the card must not pass for lack of news.
    c = card(fresh_client.get("/console/", headers=JSON).get_json(), "processes")
    assert c["ok"] is False and "worker" in c["words"] and "scheduler" in c["words"]


def test_a_stalled_worker_is_named_on_a_red_processes_card_that_asks_for_a_human_not_a_stale_one(
    make_fresh_app, fake_clock
):
    """The card's own check (reading the heartbeats) ran: a stalled process is news, not a lack of it."""
    from support import leave_heartbeats, log_in

    app = make_fresh_app(HEALTH_STALE_SECONDS=1, CLOCK=fake_clock)
    client = app.test_client()
    log_in(app, client)
    leave_heartbeats(app)  # beats written on the real clock (RQ's and the scheduler's own)
    fake_clock.catch_up(1.5)  # the health check's clock: 1.5 s after the beats
    c = card(client.get("/console/", headers=JSON).get_json(), "processes")
    assert c["ok"] is False and c["stale"] is False and "stalled: worker test-worker-" in c["words"]
    assert c["count"] == 2 and c["words"].startswith("2 stalled:")  # each stalled process once, not also as missing
    html = client.get("/console/", headers=HTML).get_data(as_text=True)
    section = re.search(r'<section[^>]*data-card="processes".*?</section>', html, re.S).group(0)
    assert "needs a human" in section and "not checked lately" not in section


def test_the_dashboard_charts_count_the_orders_placed_paid_and_cancelled_in_the_last_hour(
    fresh_app, fresh_client, token
):
    first, _ = placed_order_in(fresh_app)
    placed_order_in(fresh_app)
    placed_order_in(fresh_app)
    cancel_in(fresh_app, first)
    with fresh_app.app_context():  # outside the hour: not counted
        db.session.add(
            OutboxEvent(order_id=None, name="OrderPaid", payload={}, created_at=utcnow() - timedelta(minutes=90))
        )
        db.session.add(
            OutboxEvent(order_id=None, name="OrderPaid", payload={}, created_at=utcnow() - timedelta(minutes=20))
        )
        db.session.commit()
    data = fresh_client.get("/console/", headers=JSON).get_json()
    charts = data["charts"]
    assert charts["totals"] == {"placed": 3, "paid": 1, "cancelled": 1}
    assert len(charts["orders"]["placed"]) == 60 and charts["orders"]["paid"][-21] == 1
    assert charts["orders"]["placed"][-1] + charts["orders"]["placed"][-2] == 3

    html = fresh_client.get("/console/", headers=HTML).get_data(as_text=True)
    placed = re.search(r'<figure[^>]*id="chart-placed".*?</figure>', html, re.S).group(0)
    assert "<svg" in placed and 'role="img"' in placed and "<title" in placed
    assert "3 orders placed in the last 60 minutes" in placed
    assert placed.count('<rect class="bar placed"') in (1, 2)  # one bar per minute with orders
    assert "1 order paid in the last 60 minutes" in html and "1 order cancelled in the last 60 minutes" in html
    assert re.search(r'id="chart-lag"', html)
    assert "style=" not in html.split("<main", 1)[1]  # the CSP forbids inline style attributes


def test_the_charts_count_the_finished_minutes_once_and_the_current_minute_on_every_refresh(fresh_app):
    from sqlalchemy import event

    from shop.console import charts

    now = utcnow().replace(second=30, microsecond=0)
    with fresh_app.app_context():
        for minutes_ago in (0, 5):
            db.session.add(
                OutboxEvent(
                    order_id=None,
                    name="OrderPlaced",
                    payload={},
                    created_at=now - timedelta(minutes=minutes_ago, seconds=10),
                )
            )
        db.session.commit()
        seen = []

        def listener(conn, cursor, statement, *rest):
            if statement.lstrip().upper().startswith("SELECT"):
                seen.append(statement)

        event.listen(db.engine, "before_cursor_execute", listener)
        try:
            first = charts.charts(now)
            assert first["totals"]["placed"] == 2 and first["orders"]["placed"][-1] == 1
            assert first["orders"]["placed"][-6] == 1
            assert len(seen) == 4  # events and lag, for the finished minutes and for the current one
            seen.clear()
            db.session.add(
                OutboxEvent(order_id=None, name="OrderPlaced", payload={}, created_at=now - timedelta(seconds=5))
            )
            db.session.commit()
            seen.clear()
            again = charts.charts(now + timedelta(seconds=20))
            assert again["totals"]["placed"] == 3 and again["orders"]["placed"][-1] == 2
            assert len(seen) == 2  # only the current minute
            seen.clear()
            # The next minute: only the minute that just finished is counted, and the new current one.
            # (The proof: a row written now into a minute counted before is not read again.)
            db.session.add(
                OutboxEvent(order_id=None, name="OrderPlaced", payload={}, created_at=now - timedelta(minutes=10))
            )
            db.session.commit()
            seen.clear()
            later = charts.charts(now + timedelta(minutes=1))
            assert len(seen) == 4 and all("outbox" in sql for sql in seen)
            assert later["orders"]["placed"][-2] == 2 and later["orders"]["placed"][-7] == 1
            assert later["totals"]["placed"] == 3
        finally:
            event.remove(db.engine, "before_cursor_execute", listener)


def test_a_retried_or_discarded_dead_letter_stays_on_the_dead_list_with_its_new_state(fresh_app, fresh_client, token):
    order_id, _ = placed_order_in(fresh_app)
    delivery = cancel_in(fresh_app, order_id)
    dead_letter(fresh_app, delivery)
    with fresh_app.app_context():
        command = (
            db.session.execute(select(ScheduledCommand.id).where(ScheduledCommand.order_id == order_id))
            .scalars()
            .first()
        )
        db.session.execute(
            update(ScheduledCommand)
            .where(ScheduledCommand.id == command)
            .values(status="dead", last_error="RuntimeError: boom")
        )
        db.session.commit()

    r = fresh_client.post(
        f"/console/outbox/{delivery}/retry",
        data={"csrf_token": token, "next": "/console/outbox?status=dead"},
        headers=HTML,
    )
    assert r.status_code == 303
    assert r.headers["Location"] == f"/console/outbox?status=dead&keep={delivery}"
    html = fresh_client.get(r.headers["Location"], headers=HTML).get_data(as_text=True)
    row = re.search(
        rf'<tr class="kept">\s*<td><strong>Put the stock back</strong> <code class="small">restore_inventory</code> '
        rf'<span class="muted small">#{delivery}</span>.*?</tr>',
        html,
        re.S,
    )
    assert row and "just retried" in row.group(0) and "badge pending" in row.group(0)
    # Without keep= the list is the filter's own: the retried row is no longer dead.
    assert f'restore_inventory</code> <span class="muted small">#{delivery}</span>' not in fresh_client.get(
        "/console/outbox?status=dead", headers=HTML
    ).get_data(as_text=True)

    r = fresh_client.post(
        f"/console/outbox/cmd-{command}/discard",
        data={"csrf_token": token, "reason": "a duplicate", "next": "/console/outbox?status=dead"},
        headers=HTML,
    )
    assert r.headers["Location"] == f"/console/outbox?status=dead&keep=cmd-{command}"
    html = fresh_client.get(r.headers["Location"], headers=HTML).get_data(as_text=True)
    assert re.search(
        r'<tr class="kept">\s*<td><strong>[^<]+</strong> <code class="small">\w+</code> '
        rf'<span class="muted small">#{command}</span>'
        r' <span class="badge kept">just discarded</span>',
        html,
    )
    data = fresh_client.get(r.headers["Location"], headers=JSON).get_json()
    assert data["kept"]["id"] == f"cmd-{command}" and data["kept"]["status"] == "discarded"
    assert fresh_client.get("/console/outbox?status=dead&keep=nonsense", headers=HTML).status_code == 200
