"""A command drain that finds nothing due waits for a command about to fall due (its lookahead,
runner.COMMAND_LOOKAHEAD_SECONDS) instead of ending and leaving it to the next poll: deadlines run
at their instant. It waits only within the lookahead, within what is left of its budget, and not
when other jobs wait for the worker. On a clock the test moves: the drain's sleep moves it."""

from __future__ import annotations

from datetime import timedelta

import pytest

import shop.scheduling.commands
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.outbox import runner
from shop.outbox.dispatch import drain_commands
from shop.outbox.writer import schedule_command

# What the drain sleeps past the next command's due time, so that its claim finds it due.
MARGIN = timedelta(seconds=0.005)


@pytest.fixture
def clocked(make_fresh_app, fake_clock, monkeypatch):
    """An app on a clock the test moves, and a command that records when it ran (and, as
    "slow", takes 1.8 s of that clock)."""
    runs = []

    def slow(row, now):
        runs.append((row.id, now))
        fake_clock.advance(1.8)

    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "counting", lambda row, now: runs.append((row.id, now)))
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "slow", slow)
    return make_fresh_app(CLOCK=fake_clock), runs


def _schedule(kind: str, after: float) -> int:
    command_id = schedule_command(db.session, kind, utcnow() + timedelta(seconds=after), now=utcnow())
    db.session.commit()
    return command_id


def test_a_command_drain_waits_for_a_command_falling_due_within_its_lookahead(clocked):
    app, runs = clocked
    with app.app_context():
        start = utcnow()
        soon = _schedule("counting", 0.3)
        assert runner.COMMAND_LOOKAHEAD_SECONDS > 0.3

        result = drain_commands(budget_seconds=0.9)

        assert (result.get("done"), result["more"]) == (1, False)
        ran_at = start + timedelta(seconds=0.3) + MARGIN
        assert runs == [(soon, ran_at)]
        assert utcnow() == ran_at  # one sleep, to the command's time and no later
        db.session.remove()


def test_a_command_drain_does_not_wait_past_its_lookahead(clocked):
    app, runs = clocked
    with app.app_context():
        start = utcnow()
        _schedule("counting", runner.COMMAND_LOOKAHEAD_SECONDS + 0.1)

        assert drain_commands(budget_seconds=2.0) == {"more": False}

        assert (runs, utcnow()) == ([], start)
        db.session.remove()


def test_a_command_drain_does_not_wait_when_other_jobs_wait_for_the_worker(clocked):
    app, runs = clocked
    with app.app_context():
        start = utcnow()
        _schedule("counting", 0.3)

        assert drain_commands(budget_seconds=2.0, should_yield=lambda: True) == {"more": False}

        assert (runs, utcnow()) == ([], start)
        db.session.remove()


def test_a_command_drain_waits_only_within_what_is_left_of_its_budget(clocked):
    app, runs = clocked
    with app.app_context():
        start = utcnow()
        first = _schedule("slow", 0)  # takes 1.8 s of a 2.0 s budget
        _schedule("counting", 1.8 + 0.3)  # due 0.3 s after it: beyond the 0.2 s left

        result = drain_commands(budget_seconds=2.0)

        assert (result.get("done"), result["more"]) == (1, False)
        assert runs == [(first, start)]
        assert utcnow() == start + timedelta(seconds=1.8)
        db.session.remove()
