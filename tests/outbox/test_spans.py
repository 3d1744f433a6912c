"""Each row runs in a span of its own (docs/REFERENCE.md, Tracing): a child of the span whose commit
wrote it (the traceparent stored on the row), linked to the span it ran under, named for what the
row is for, and told its outcome. Here with a tracer that records what the shop asks of it (the
shop's own seam, shop.traces), in this process; the real OpenTelemetry wiring: tests/test_tracing.py."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

from sqlalchemy import select

import shop.saga
import shop.scheduling.commands
from factories import place_order_for, seed_catalog_rows
from shop import traces
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import OutboxDelivery
from shop.outbox.dispatch import drain_commands, run_command, run_delivery
from shop.outbox.runner import RunOutcome
from shop.outbox.subscriptions import SUBSCRIPTIONS
from shop.outbox.writer import schedule_command

WRITER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
RUNNER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER_WRITER = "00-5c2e8a1f9b3d4e6f8a0b1c2d3e4f5a6b-1a2b3c4d5e6f7a8b-01"


class Recorder:
    """A tracer (shop.traces.Tracer) that keeps every span and note asked of it."""

    def __init__(self):
        self.current, self.spans, self.notes = WRITER, [], []

    def traceparent(self) -> str | None:
        return self.current

    def trace_id(self) -> str | None:
        return self.current.split("-")[1]

    @contextmanager
    def span(self, name, kind, parent, links, attributes):
        self.spans.append((name, kind, parent, list(links), dict(attributes)))
        yield

    def note(self, attributes) -> None:
        self.notes.append(dict(attributes))

    def describe(self) -> str:
        return "recorder"


def _process(spans, name: str) -> list[tuple]:
    return [s for s in spans if s[0] == name]


def test_a_command_and_a_delivery_run_in_a_child_span_of_their_writer_linked_to_their_runner(fresh_app, monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(traces, "_tracer", recorder)
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "noting", lambda *_: None)
    monkeypatch.setitem(SUBSCRIPTIONS, "OrderPlaced", ["noting_followup"])
    monkeypatch.setitem(shop.saga.HANDLERS, "noting_followup", lambda *_: None)
    with fresh_app.app_context():
        a5 = seed_catalog_rows()["NB-A5-DOT"]
        now = utcnow()
        order_id = place_order_for({a5: 1}).order_id  # written under WRITER
        command_id = schedule_command(db.session, "noting", now, order_id=order_id, now=now)
        db.session.commit()
        delivery_id = db.session.execute(
            select(OutboxDelivery.id).where(OutboxDelivery.order_id == order_id)
        ).scalar_one()
        recorder.current, recorder.notes = RUNNER, []

        later = now + timedelta(seconds=1)
        assert run_command(command_id, now=later) == RunOutcome.DONE  # the claim returns the row
        assert run_delivery(delivery_id, now=later) == RunOutcome.DONE  # the row is read by id

        common = {"messaging.system": "backstop.outbox", "messaging.operation.type": "process"}
        assert _process(recorder.spans, "process noting") == [
            (
                "process noting",
                traces.CONSUMER,
                WRITER,
                [RUNNER],
                {
                    **common,
                    "messaging.destination.name": "noting",
                    "messaging.message.id": str(command_id),
                    "backstop.order_id": order_id,
                },
            )
        ]
        [(_, kind, parent, links, attributes)] = _process(recorder.spans, "process noting_followup")
        assert (kind, parent, links) == (traces.CONSUMER, WRITER, [RUNNER])
        assert attributes == {
            **common,
            "messaging.destination.name": "noting_followup",
            "messaging.message.id": str(delivery_id),
        }
        assert recorder.notes.count({"outcome": "done"}) == 2
        db.session.remove()


def test_a_row_that_fails_tells_its_span_the_error_and_the_outcome(fresh_app, monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(traces, "_tracer", recorder)

    def failing(command, now):
        raise RuntimeError("the mail server said no " + "x" * 600)

    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "failing", failing)
    with fresh_app.app_context():
        now = utcnow()
        command_id = schedule_command(db.session, "failing", now, now=now)
        db.session.commit()

        assert run_command(command_id, now=now + timedelta(seconds=1)) == RunOutcome.RETRY

        error = ("RuntimeError: the mail server said no " + "x" * 600)[:500]
        assert recorder.notes == [{"error": error}, {"outcome": "retry"}]
        db.session.remove()


def test_a_drains_batch_runs_in_one_span_linked_to_every_rows_writer_that_parents_each_rows_span(
    fresh_app, monkeypatch
):
    """As the messaging conventions link a batch to its messages: one consumer span per batch,
    named for the table, counting its rows, linked to the span that wrote each row."""
    recorder = Recorder()
    monkeypatch.setattr(traces, "_tracer", recorder)
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "noting", lambda *_: None)
    with fresh_app.app_context():
        now = utcnow()
        schedule_command(db.session, "noting", now, now=now)  # written under WRITER
        db.session.commit()
        recorder.current = OTHER_WRITER
        schedule_command(db.session, "noting", now, now=now)
        db.session.commit()
        recorder.current = RUNNER

        assert drain_commands(now=now + timedelta(seconds=1))[RunOutcome.DONE] == 2

        assert _process(recorder.spans, "drain scheduled_commands") == [
            (
                "drain scheduled_commands",
                traces.CONSUMER,
                None,
                [WRITER, OTHER_WRITER],
                {"messaging.system": "backstop.outbox", "messaging.batch.message_count": 2},
            )
        ]
        assert [s[1:3] for s in _process(recorder.spans, "process noting")] == [(traces.CONSUMER, WRITER)] + [
            (traces.CONSUMER, OTHER_WRITER)
        ]
        db.session.remove()


def test_a_row_written_outside_any_span_runs_in_a_child_of_its_runner_with_no_link(fresh_app, monkeypatch):
    """Without a writer's span to be the child of, the row's span is simply its runner's child: a
    link to that same span would say nothing."""
    recorder = Recorder()
    monkeypatch.setattr(traces, "_tracer", recorder)
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "noting", lambda *_: None)
    with fresh_app.app_context():
        now = utcnow()
        recorder.current = None  # written by no traced request (a CLI, tracing off at the time)
        command_id = schedule_command(db.session, "noting", now, now=now)
        db.session.commit()
        recorder.current = RUNNER

        assert run_command(command_id, now=now + timedelta(seconds=1)) == RunOutcome.DONE

        [(_, kind, parent, links, _)] = _process(recorder.spans, "process noting")
        assert (kind, parent, links) == (traces.CONSUMER, None, [])
        db.session.remove()
