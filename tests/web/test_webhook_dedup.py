"""The webhook's one-transaction path: the event's dedup row, the transition and the delivery's
receipt commit together, so a delivery racing another one for the same event, or carrying
fields the receipt table cannot hold, still changes the order at most once and is recorded."""

from __future__ import annotations

import copy
import os
import threading

import pytest
from sqlalchemy import create_engine, text

from payment_helpers import order_id, paid_at_provider, post_webhook, stripe_event
from shop.extensions import db
from shop.models import OutboxEvent, ProcessedStripeEvent, WebhookReceipt
from support import wait_until

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgres")


def _state(app, ref) -> tuple[list, list, int]:
    """(receipts as (event id, outcome), the order's outbox event names, processed-event rows)."""
    oid = order_id(app, ref)
    with app.app_context():
        receipts = [(r.event_id, r.outcome) for r in db.session.query(WebhookReceipt).order_by(WebhookReceipt.id)]
        events = [e.name for e in db.session.query(OutboxEvent).filter_by(order_id=oid).order_by(OutboxEvent.id)]
        processed = db.session.query(ProcessedStripeEvent).count()
        db.session.remove()
    return receipts, events, processed


def _post_while_event_is_claimed(app, database_url, event, *, claim_commits: bool):
    """Another transaction claims the event (its dedup row, uncommitted) and holds it while the
    delivery arrives; it then commits or rolls back. Returns the delivery's response."""
    engine = create_engine(database_url)
    answer = {}
    try:
        with engine.connect() as other:
            other.execute(
                text("INSERT INTO processed_stripe_events (event_id, processed_at) VALUES (:e, now())"),
                {"e": event["id"]},
            )
            poster = threading.Thread(target=lambda: answer.setdefault("r", post_webhook(app.test_client(), event)))
            poster.start()
            wait_until(
                lambda: other.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    )
                ).scalar(),
                timeout=10,
                what="the delivery to wait for the other claim of its event",
                interval=0.02,
            )
            assert poster.is_alive()
            if claim_commits:
                other.commit()
            else:
                other.rollback()
            poster.join(timeout=10)
            assert not poster.is_alive()
    finally:
        engine.dispose()
    return answer["r"]


@pytest.mark.skipif(not ON_POSTGRES, reason="needs two open write transactions at once (PostgreSQL)")
def test_a_delivery_racing_a_committed_claim_of_its_event_is_a_duplicate_and_changes_nothing(
    fresh_paying_app, shopper, sandbox, database_url
):
    order, event = paid_at_provider(shopper, sandbox)
    r = _post_while_event_is_claimed(fresh_paying_app, database_url, event, claim_commits=True)
    assert r.status_code == 200 and r.get_json()["outcome"] == "duplicate"
    after = shopper.order(order["reference"])
    assert after["status"] == "PaymentInitiated" and after["version"] == order["version"]
    receipts, events, processed = _state(fresh_paying_app, order["reference"])
    assert receipts == [(event["id"], "duplicate")]
    assert "OrderPaid" not in events and processed == 1


@pytest.mark.skipif(not ON_POSTGRES, reason="needs two open write transactions at once (PostgreSQL)")
def test_a_delivery_racing_a_claim_that_rolls_back_applies_the_event_once(
    fresh_paying_app, shopper, sandbox, database_url
):
    order, event = paid_at_provider(shopper, sandbox)
    r = _post_while_event_is_claimed(fresh_paying_app, database_url, event, claim_commits=False)
    assert r.status_code == 200 and r.get_json()["outcome"] == "paid"
    after = shopper.order(order["reference"])
    assert after["status"] == "Paid" and after["version"] == order["version"] + 1
    receipts, events, processed = _state(fresh_paying_app, order["reference"])
    assert receipts == [(event["id"], "accepted")]
    assert events.count("OrderPaid") == 1 and processed == 1
    assert post_webhook(shopper.client, event).get_json()["outcome"] == "duplicate"


def test_an_event_naming_an_order_id_beyond_the_column_is_accepted_as_unknown_and_recorded(
    fresh_paying_app, shopper, sandbox
):
    _, completed = paid_at_provider(shopper, sandbox)
    foreign = copy.deepcopy(completed)
    foreign["id"] = "evt_huge_order_id"
    foreign["data"]["object"].update(
        metadata={"order_id": str(2**40)}, client_reference_id="BK-NOSUCH", id="cs_test_not_ours"
    )
    r = post_webhook(shopper.client, foreign)
    assert r.status_code == 200 and r.get_json()["outcome"] == "unknown_order"
    with fresh_paying_app.app_context():
        [receipt] = db.session.query(WebhookReceipt).all()
        assert (receipt.event_id, receipt.outcome, receipt.order_id) == ("evt_huge_order_id", "accepted", None)
        assert db.session.get(ProcessedStripeEvent, "evt_huge_order_id") is not None
        db.session.remove()
    assert post_webhook(shopper.client, foreign).get_json()["outcome"] == "duplicate"


def test_a_signed_thin_event_notification_is_rejected_as_unparseable(fresh_paying_app):
    event = stripe_event("v1.billing.meter.error_report_triggered", {"id": "x"}, "evt_thin")
    event["object"] = "v2.core.event"
    r = post_webhook(fresh_paying_app.test_client(), event)
    assert r.status_code == 400
    with fresh_paying_app.app_context():
        [receipt] = db.session.query(WebhookReceipt).all()
        assert receipt.outcome == "rejected" and receipt.reason.startswith("unparseable body")
        db.session.remove()


@pytest.mark.skipif(not ON_POSTGRES, reason="needs a writer to commit between another's read and write (PostgreSQL)")
def test_a_payment_applied_by_another_writer_between_the_notices_read_and_write_is_applied_once(
    fresh_paying_app, shopper, sandbox
):
    """The usual payment notice reads the order, then writes Paid with `WHERE version = <read>`.
    Here the customer's return page applies the same payment in between (its own transaction,
    committed): the webhook's write must miss, re-read, and find the order already paid. Without
    the version guard both would write Paid and the order would get two OrderPaid events (two
    confirmation emails)."""
    from sqlalchemy import event as sa_event

    from shop.payments.apply import apply_session
    from shop.provider import gateway

    order, completed = paid_at_provider(shopper, sandbox)
    ref, sid = order["reference"], order["payment"]["session_id"]
    with fresh_paying_app.app_context():
        engine = db.engine
        view = gateway.retrieve_session(sid)
        db.session.remove()
    raced = []

    def the_return_page_pays_first(_conn, _cursor, statement, *_rest):
        if raced or not statement.startswith("UPDATE orders SET status"):
            return
        raced.append(True)

        def other_writer():
            with fresh_paying_app.app_context():
                assert apply_session(view, source="return").outcome == "paid"
                db.session.remove()

        t = threading.Thread(target=other_writer)
        t.start()
        t.join(30)
        assert not t.is_alive()

    sa_event.listen(engine, "before_cursor_execute", the_return_page_pays_first)
    try:
        r = post_webhook(shopper.client, completed)
    finally:
        sa_event.remove(engine, "before_cursor_execute", the_return_page_pays_first)

    assert raced, "the other writer never ran"
    assert r.status_code == 200 and r.get_json()["outcome"] == "noop"
    after = shopper.order(ref)
    assert after["status"] == "Paid" and after["version"] == order["version"] + 1
    receipts, events, processed = _state(fresh_paying_app, ref)
    assert events.count("OrderPaid") == 1
    assert receipts == [(completed["id"], "accepted")] and processed == 1
