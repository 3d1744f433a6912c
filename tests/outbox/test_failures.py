"""What a failed attempt leaves on its row (runner.record_failure): an outage of the provider keeps
the attempt and waits by its own backoff, counting the outages in a row, for as long as it takes;
an error of our own spends the attempt and waits by the ordinary backoff; a refusal is dead at
once; and a row that is no longer ours is left as its new owner has it. Each with the words the
row and the log say it in."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import select, update

import shop.scheduling.commands
from shop.domain.deadlines import FAILURE_PROVIDER, as_utc, utcnow
from shop.extensions import db
from shop.models import ScheduledCommand
from shop.outbox.dispatch import run_command
from shop.outbox.failures import DeadEnd, PermanentFailure
from shop.outbox.runner import RunOutcome, worker_identity
from shop.outbox.writer import schedule_command

BASE, PROVIDER_BASE = 1.0, 10.0


class ProviderDown(Exception):
    failure_kind = FAILURE_PROVIDER


class Failing:
    """A command that raises whatever `error` holds when it runs."""

    def __init__(self):
        self.error: Exception = ProviderDown("stripe timed out")

    def __call__(self, row, now):
        raise self.error


@pytest.fixture
def failing(make_fresh_app, monkeypatch):
    command = Failing()
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "failing", command)
    app = make_fresh_app(
        OUTBOX_MAX_ATTEMPTS=2,
        OUTBOX_RETRY_BASE_SECONDS=BASE,
        OUTBOX_RETRY_CAP_SECONDS=300.0,
        OUTBOX_PROVIDER_RETRY_BASE_SECONDS=PROVIDER_BASE,
        OUTBOX_PROVIDER_RETRY_CAP_SECONDS=300.0,
    )
    return app, command


def _row(command_id: int) -> ScheduledCommand:
    db.session.expire_all()
    row = db.session.execute(select(ScheduledCommand).where(ScheduledCommand.id == command_id)).scalar_one()
    db.session.rollback()
    return row


def _schedule(now) -> int:
    command_id = schedule_command(db.session, "failing", now, now=now)
    db.session.commit()
    return command_id


def _delay(row, now) -> float:
    assert as_utc(row.enqueued_at) == as_utc(row.next_attempt_at)
    return (as_utc(row.next_attempt_at) - now).total_seconds()


def test_a_provider_outage_keeps_the_attempt_and_waits_longer_each_time_in_a_row(failing, caplog):
    app, command = failing
    with app.app_context(), caplog.at_level(logging.WARNING, logger="shop.outbox"):
        now = utcnow()
        command_id = _schedule(now)
        delays = []
        for waits in (1, 2, 3):  # more outages than the row has attempts: never dead for them
            assert run_command(command_id, now=now) == RunOutcome.WAITING
            row = _row(command_id)
            assert (row.status, row.attempts, row.provider_waits, row.failure_kind) == ("pending", 0, waits, "provider")
            assert (row.claimed_until, row.last_error) == (
                None,
                "waiting for the provider: ProviderDown: stripe timed out",
            )
            assert "ProviderDown: stripe timed out" in row.last_traceback
            delays.append(_delay(row, now))
            now = as_utc(row.next_attempt_at)

        # The provider's own backoff, from the outages in a row: [base * 2^(n-1) / 2, base * 2^(n-1)).
        assert all(
            PROVIDER_BASE * 2 ** (n - 1) / 2 <= d < PROVIDER_BASE * 2 ** (n - 1) for n, d in enumerate(delays, 1)
        )
        message = caplog.records[-1].getMessage()
        assert message == (
            f"command {command_id} (failing, order None) is waiting for the provider (3 failure(s) in a row, "
            f"attempts kept at 0 of 2), retrying in {delays[-1]:.1f}s: "
            "waiting for the provider: ProviderDown: stripe timed out"
        )
        assert caplog.records[-1].levelno == logging.WARNING

        # An error of our own after the outage spends the attempt, and the outages in a row start over.
        command.error = RuntimeError("bad payload")
        assert run_command(command_id, now=now) == RunOutcome.RETRY
        row = _row(command_id)
        assert (row.status, row.attempts, row.provider_waits, row.failure_kind) == ("pending", 1, 0, "error")
        assert (row.claimed_until, row.last_error) == (None, "RuntimeError: bad payload")
        delay = _delay(row, now)
        assert BASE / 2 <= delay < BASE
        assert caplog.records[-1].getMessage() == (
            f"command {command_id} (failing, order None) failed (attempt 1 of 2), retrying in {delay:.1f}s: "
            "RuntimeError: bad payload"
        )
        db.session.remove()


def test_a_refusal_is_a_dead_letter_at_once_with_its_error(failing, caplog):
    app, command = failing
    command.error = PermanentFailure("card declined for good")
    with app.app_context(), caplog.at_level(logging.WARNING, logger="shop.outbox"):
        now = utcnow()
        command_id = _schedule(now)

        assert run_command(command_id, now=now) == RunOutcome.DEAD

        row = _row(command_id)
        assert (row.status, row.attempts, row.failure_kind, row.claimed_until) == ("dead", 1, "refused", None)
        assert row.last_error == "PermanentFailure: card declined for good"
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (
                logging.ERROR,
                f"dead letter: command {command_id} (failing, order None) failed 1 time(s), "
                "last error: PermanentFailure: card declined for good",
            )
        ]
        db.session.remove()


def test_a_long_error_is_kept_to_its_first_4000_characters_and_its_traceback_to_the_last_20000(failing):
    app, command = failing
    command.error = RuntimeError("x" * 30000)
    with app.app_context():
        now = utcnow()
        command_id = _schedule(now)

        assert run_command(command_id, now=now) == RunOutcome.RETRY

        row = _row(command_id)
        assert row.last_error == ("RuntimeError: " + "x" * 30000)[:4000]
        assert row.last_traceback == "x" * 19999 + "\n"  # its last 20000 characters
        db.session.remove()


@pytest.mark.parametrize("error", [RuntimeError("too late"), DeadEnd("the hold lapsed")], ids=["failure", "dead-end"])
@pytest.mark.parametrize(
    "meanwhile", [{"claimed_by": "worker-b"}, {"status": "done"}], ids=["claimed-by-another", "finished"]
)
def test_a_failure_on_a_row_that_is_no_longer_ours_leaves_it_as_it_is(failing, meanwhile, error):
    """Our lease lapsed while the command ran, and another worker took the row (or finished it):
    neither a failure nor a dead end is recorded on it, and (a dead end's writes would commit with
    it) nothing the run wrote commits."""
    app, command = failing
    with app.app_context():
        now = utcnow()
        command_id = _schedule(now)
        bystander = _schedule(now)

        def taken_over(row, at):
            with app.app_context():  # the other worker, in its own session
                db.session.execute(update(ScheduledCommand).where(ScheduledCommand.id == row.id).values(**meanwhile))
                db.session.commit()
                db.session.remove()
            db.session.execute(
                update(ScheduledCommand).where(ScheduledCommand.id == bystander).values(payload={"written": True})
            )
            raise error

        shop.scheduling.commands.COMMANDS["failing"] = taken_over

        assert run_command(command_id, now=now) == RunOutcome.SKIPPED

        row = _row(command_id)
        expected = {"status": "processing", "claimed_by": row.claimed_by, **meanwhile}
        assert (row.status, row.claimed_by, row.attempts) == (expected["status"], expected["claimed_by"], 1)
        assert (row.last_error, row.failure_kind, as_utc(row.next_attempt_at)) == (None, None, now)
        assert _row(bystander).payload == {}
        db.session.remove()


def test_a_run_whose_lease_was_taken_over_commits_none_of_its_writes_and_says_so(failing, monkeypatch, caplog):
    """The command succeeded, but meanwhile its lease lapsed and another worker claimed the row:
    "done" cannot be written under our claim, so nothing the run wrote commits."""
    app, _ = failing
    with app.app_context(), caplog.at_level(logging.WARNING, logger="shop.outbox"):
        now = utcnow()
        command_id = _schedule(now)
        bystander = _schedule(now)

        def overtaken(row, at):
            with app.app_context():  # the other worker, in its own session
                db.session.execute(
                    update(ScheduledCommand).where(ScheduledCommand.id == row.id).values(claimed_by="worker-b")
                )
                db.session.commit()
                db.session.remove()
            # This run's own write, in its transaction: it must not commit.
            db.session.execute(
                update(ScheduledCommand).where(ScheduledCommand.id == bystander).values(payload={"written": True})
            )

        monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "failing", overtaken)

        assert run_command(command_id, now=now) == RunOutcome.SKIPPED

        row = _row(command_id)
        assert (row.status, row.claimed_by, row.attempts, row.last_error) == ("processing", "worker-b", 1, None)
        assert _row(bystander).payload == {}
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (
                logging.WARNING,
                f"command {command_id} (failing, order None): lease lapsed before commit; "
                "another worker owns it now, discarding this attempt's writes",
            )
        ]
        db.session.remove()


def test_a_dead_end_is_a_dead_letter_with_its_words_and_the_writes_of_its_run_commit_with_it(failing, caplog):
    """A handler's DeadEnd (retrying cannot help, and what it wrote because of that stands): the
    row is dead under our claim, refused, its claim released, its error kept to 4000 characters,
    in the same commit as the run's own writes, and the log says so; another row this worker
    holds is left alone."""
    app, _ = failing
    with app.app_context(), caplog.at_level(logging.WARNING, logger="shop.outbox"):
        placed = utcnow() - timedelta(hours=1)  # scheduled and claimed an hour ago (the run's `now`)
        command_id = _schedule(placed)
        bystander = _schedule(placed)

        def dead_end(row, at):
            # This run's own write, and a second row held by this same worker meanwhile.
            db.session.execute(
                update(ScheduledCommand)
                .where(ScheduledCommand.id == bystander)
                .values(payload={"written": True}, status="processing", claimed_by=worker_identity())
            )
            raise DeadEnd("x" * 5000)

        shop.scheduling.commands.COMMANDS["failing"] = dead_end
        started = utcnow()

        assert run_command(command_id, now=placed) == RunOutcome.DEAD

        row = _row(command_id)
        assert (row.status, row.attempts, row.failure_kind, row.claimed_until) == ("dead", 1, "refused", None)
        assert row.last_error == ("DeadEnd: " + "x" * 5000)[:4000]
        assert as_utc(row.updated_at) >= started  # marked when it died, not when it was claimed
        other = _row(bystander)
        assert (other.payload, other.status, other.last_error) == ({"written": True}, "processing", None)
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (
                logging.ERROR,
                f"dead letter: command {command_id} (failing, order None), its writes kept: "
                + ("DeadEnd: " + "x" * 5000),
            )
        ]
        db.session.remove()
