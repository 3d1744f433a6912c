"""Work waiting (docs/REFERENCE.md, Console: the "Work waiting" card): the oldest due item no
process is working on (a delivery or command due and unclaimed, or whose claim lapsed; an RQ job
queued), computed in the database (SQLite and PostgreSQL alike), and the card red past 15 s naming
it and the workers that should take it."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from compensation_support import cancel_in
from factories import placed_order_in
from payment_helpers import JSON
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import OutboxDelivery, WorkStatus
from shop.ops.waiting import oldest_waiting, waiting_in_database, waiting_in_queues
from support import leave_heartbeats


def _card(client) -> dict:
    return next(c for c in client.get("/console/", headers=JSON).get_json()["cards"] if c["key"] == "waiting")


def _one_delivery(app) -> int:
    """A real delivery (a cancelled order's restore), the only one not done, as it was written."""
    order_id, _ = placed_order_in(app)
    delivery_id = cancel_in(app, order_id)
    with app.app_context():
        db.session.execute(
            update(OutboxDelivery).where(OutboxDelivery.id != delivery_id).values(status=WorkStatus.DONE)
        )
        db.session.commit()
        others = db.session.execute(select(OutboxDelivery.id).where(OutboxDelivery.status != WorkStatus.DONE))
        assert list(others.scalars()) == [delivery_id]
    return delivery_id


def _deliveries_waiting(now) -> list[dict]:
    return [w for w in waiting_in_database(now) if w["kind"] == "outbox delivery"]


def _set(app, delivery_id: int, **values) -> None:
    with app.app_context():
        db.session.execute(update(OutboxDelivery).where(OutboxDelivery.id == delivery_id).values(**values))
        db.session.commit()


def test_nothing_due_waits_and_the_card_is_green(fresh_app, fresh_client, token):
    with fresh_app.app_context():
        assert waiting_in_database(utcnow()) == []
    c = _card(fresh_client)
    assert c["ok"] is True and c["items"] == [] and c["words"] == "Nothing due is waiting."


def test_a_due_unclaimed_delivery_waits_from_its_next_attempt_and_not_before(fresh_app):
    delivery = _one_delivery(fresh_app)
    now = utcnow()
    _set(fresh_app, delivery, status=WorkStatus.PENDING, next_attempt_at=now + timedelta(minutes=5))
    with fresh_app.app_context():
        assert _deliveries_waiting(now) == []  # not due yet: not waiting
    _set(fresh_app, delivery, next_attempt_at=now - timedelta(seconds=20))
    with fresh_app.app_context():
        [item] = _deliveries_waiting(now)
    assert (item["id"], item["count"], item["claim_lapsed"]) == (delivery, 1, False)
    assert item["age_seconds"] == 20 and item["claimed_by"] is None


def test_a_claim_that_lapsed_waits_from_its_end_and_names_its_holder(fresh_app):
    delivery = _one_delivery(fresh_app)
    now = utcnow()
    held = dict(status=WorkStatus.PROCESSING, claimed_by="node-x:4242:1")
    _set(fresh_app, delivery, **held, claimed_until=now + timedelta(seconds=30))
    with fresh_app.app_context():
        assert _deliveries_waiting(now) == []  # a live claim: someone is working on it
    _set(fresh_app, delivery, **held, claimed_until=now - timedelta(seconds=30))
    with fresh_app.app_context():
        [item] = _deliveries_waiting(now)
    assert item["claim_lapsed"] is True and item["claimed_by"] == "node-x:4242:1" and item["age_seconds"] == 30


def test_queued_rq_jobs_wait_from_the_oldest_and_the_longest_waiting_comes_first(fresh_app):
    queues = [
        {"name": "shop-control", "kind": "rq queue", "depth": 21, "oldest_age_seconds": 40},
        {"name": "shop-work", "kind": "rq queue", "depth": 0, "oldest_age_seconds": None},
        {"name": "rq-scheduler", "kind": "schedule", "depth": 3, "oldest_age_seconds": 99},
    ]
    [job] = waiting_in_queues(queues)
    assert job["what"] == "21 jobs in RQ queue shop-control" and job["age_seconds"] == 40
    now = utcnow()
    _set(fresh_app, _one_delivery(fresh_app), status=WorkStatus.PENDING, next_attempt_at=now - timedelta(seconds=10))
    with fresh_app.app_context():
        items = oldest_waiting(now, queues)
    assert [i["kind"] for i in items][:2] == ["RQ job", "outbox delivery"]


def test_the_card_turns_red_past_fifteen_seconds_naming_the_item_and_the_registered_workers(
    fresh_app, fresh_client, token
):
    leave_heartbeats(fresh_app)
    delivery = _one_delivery(fresh_app)
    _set(fresh_app, delivery, status=WorkStatus.PENDING, next_attempt_at=utcnow() - timedelta(seconds=5))
    assert _card(fresh_client)["ok"] is True  # waiting, but within the limit
    _set(fresh_app, delivery, next_attempt_at=utcnow() - timedelta(seconds=40))
    c = _card(fresh_client)
    assert c["ok"] is False and c["count"] == 1
    assert c["words"].startswith(f"The oldest waiting: Put the stock back (outbox delivery {delivery}), waiting 4")
    assert "restore_inventory" not in c["words"] and c["items"][0]["code"] == "restore_inventory"
    [worker] = [p for p in fresh_client.get("/console/", headers=JSON).get_json()["processes"] if p["role"] == "worker"]
    assert f"{worker['name']} (node {worker['node']}, pid {worker['pid']}, beating)" in c["words"]


def test_the_card_names_the_worker_whose_claim_lapsed(fresh_app, fresh_client, token):
    _set(
        fresh_app,
        _one_delivery(fresh_app),
        status=WorkStatus.PROCESSING,
        claimed_by="node-x:4242:1",
        claimed_until=utcnow() - timedelta(seconds=30),
    )
    c = _card(fresh_client)
    assert c["ok"] is False
    assert "Its claim, held by node-x:4242:1 (node node-x, pid 4242, no longer registered), lapsed" in c["words"]
    assert c["words"].endswith("No worker is registered to take it.")


def test_the_lag_chart_counts_work_still_waiting_in_the_minute_it_was_seen(fresh_app, fresh_client, token):
    from shop.console import charts

    now = utcnow().replace(second=30, microsecond=0)
    with fresh_app.app_context():
        assert charts.charts(now)["outbox_lag_seconds"][-1] is None  # nothing finished, nothing waiting
        assert charts.charts(now, 42.0)["outbox_lag_seconds"][-1] == 42.0
        assert charts.charts(now + timedelta(seconds=10), 12.0)["outbox_lag_seconds"][-1] == 42.0  # the longest
        later = charts.charts(now + timedelta(minutes=1))["outbox_lag_seconds"]
        assert later[-2] == 42.0 and later[-1] is None  # kept for its minute; nothing waits now
    _set(
        fresh_app, _one_delivery(fresh_app), status=WorkStatus.PENDING, next_attempt_at=utcnow() - timedelta(seconds=40)
    )
    data = fresh_client.get("/console/", headers=JSON).get_json()
    assert data["charts"]["outbox_lag_seconds"][-1] >= 40
