"""The request id travels with the work (docs/REFERENCE.md, Logs): the deliveries and commands a
transaction writes carry the request id of the log context it was written in, as a bound
parameter of the same INSERT (on PostgreSQL still the one event-and-deliveries statement), and
a row written outside any request carries none."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import event as sa_event
from sqlalchemy import select

import shop.saga
import shop.scheduling.commands
from factories import place_order_for, seed_catalog_rows
from shop import logs
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import OutboxDelivery, ScheduledCommand
from shop.outbox.dispatch import run_command, run_delivery
from shop.outbox.runner import RunOutcome
from shop.outbox.subscriptions import SUBSCRIPTIONS
from shop.outbox.writer import schedule_command


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


def test_a_delivery_and_a_command_run_in_the_log_context_of_their_row_and_leave_it(fresh_app, monkeypatch):
    """What a run logs names its row, its order and the request the row was written in; the scope
    ends with the run."""
    seen = []
    note = lambda *_: seen.append({k: logs.current().get(k) for k in logs.FIELDS if k != "order_ref"})  # noqa: E731
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "noting", note)
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", ["noting_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "noting_followup", note)
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        now = utcnow()
        with logs.scope(request_id="req-run-1"):
            order_id = place_order_for({a5: 1}).order_id
            command_id = schedule_command(db.session, "noting", now, order_id=order_id, now=now)
            db.session.commit()
        delivery_id = db.session.execute(
            select(OutboxDelivery.id).where(OutboxDelivery.order_id == order_id)
        ).scalar_one()

        later = utcnow() + timedelta(seconds=1)  # the delivery is due from the placement on
        assert run_command(command_id, now=later) == RunOutcome.DONE
        assert run_delivery(delivery_id, now=later) == RunOutcome.DONE

        row = {"request_id": "req-run-1", "job_id": None, "order_id": order_id}
        assert seen == [
            {**row, "delivery_id": None, "command_id": command_id},
            {**row, "delivery_id": delivery_id, "command_id": None},
        ]
        assert logs.current() == {}
        db.session.remove()
