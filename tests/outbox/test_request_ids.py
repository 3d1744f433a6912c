"""The request id travels with the work (docs/REFERENCE.md, Logs): the deliveries and commands a
transaction writes carry the request id of the log context it was written in, as a bound
parameter of the same INSERT (on PostgreSQL still the one event-and-deliveries statement), and
a row written outside any request carries none."""

from __future__ import annotations

from sqlalchemy import event as sa_event
from sqlalchemy import select

import shop.saga
from factories import place_order_for, seed_catalog_rows
from shop import logs
from shop.extensions import db
from shop.models import OutboxDelivery, ScheduledCommand
from shop.outbox.subscriptions import SUBSCRIPTIONS


def _written(order_id: int) -> tuple[dict, dict]:
    deliveries = db.session.execute(
        select(OutboxDelivery.handler, OutboxDelivery.request_id).where(OutboxDelivery.order_id == order_id)
    ).all()
    commands = db.session.execute(
        select(ScheduledCommand.kind, ScheduledCommand.request_id).where(ScheduledCommand.order_id == order_id)
    ).all()
    return dict(deliveries), dict(commands)


def test_a_checkouts_deliveries_and_deadline_carry_its_request_id_in_the_same_statements(
    make_fresh_app, monkeypatch, is_postgres
):
    # Two handlers on OrderPlaced (which has none of its own): registration, not a mock.
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", ["first_followup", "second_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "first_followup", lambda event, now: None)
    monkeypatch.setitem(shop.saga.HANDLERS, "second_followup", lambda event, now: None)
    app = make_fresh_app()
    with app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        statements: list[str] = []

        def record(_conn, _cursor, statement, *_args):
            if "outbox_deliveries" in statement or "outbox_events" in statement:
                statements.append(statement)

        sa_event.listen(db.engine, "before_cursor_execute", record)
        try:
            with logs.scope(request_id="req-outbox-1"):
                in_request = place_order_for({a5: 1}).order_id
        finally:
            sa_event.remove(db.engine, "before_cursor_execute", record)
        outside = place_order_for({a5: 1}).order_id

        assert _written(in_request) == (
            {"first_followup": "req-outbox-1", "second_followup": "req-outbox-1"},
            {"expire_unpaid_order": "req-outbox-1"},
        )
        assert _written(outside) == (
            {"first_followup": None, "second_followup": None},
            {"expire_unpaid_order": None},
        )
        inserts = [s for s in statements if s.lstrip().upper().startswith(("INSERT", "WITH"))]
        # PostgreSQL: the event and both deliveries in one statement; SQLite: the event, then each delivery.
        assert len(inserts) == (1 if is_postgres else 3), inserts
        db.session.remove()
