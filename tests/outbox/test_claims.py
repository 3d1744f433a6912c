"""The outbox's lookups and hand-backs, one statement at a time: what the scheduler's poll asks
(any_due), what the deadline's budget counts (count_due), what a command drain waits for
(next_due_within), and what a row that is not due yet goes back to (a Reschedule). Each pinned at
its edges: a second early or late, another kind, a row someone holds, a row out of attempts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select, update

import shop.scheduling.commands
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import CommandKind, ScheduledCommand
from shop.outbox import claims, runner
from shop.outbox.dispatch import run_command
from shop.outbox.failures import Reschedule
from shop.outbox.writer import schedule_command


def _command(kind: str, due, **values) -> int:
    command_id = schedule_command(db.session, kind, due, now=due - timedelta(seconds=60))
    if values:
        db.session.execute(update(ScheduledCommand).where(ScheduledCommand.id == command_id).values(**values))
    db.session.commit()
    return command_id


def _row(command_id: int) -> ScheduledCommand:
    db.session.expire_all()
    row = db.session.execute(select(ScheduledCommand).where(ScheduledCommand.id == command_id)).scalar_one()
    db.session.rollback()
    return row


def test_any_due_sees_a_row_from_its_due_time_and_a_lease_only_once_it_lapsed(fresh_app):
    lease = timedelta(seconds=fresh_app.config["OUTBOX_LEASE_SECONDS"])
    second = timedelta(seconds=1)
    with fresh_app.app_context():
        due = utcnow().replace(microsecond=0)
        command_id = _command("counting", due)

        assert (claims.any_due(ScheduledCommand, due - second), claims.any_due(ScheduledCommand, due)) == (False, True)
        assert claims.claim(ScheduledCommand, command_id, due, "worker-a")
        # Claimed: not due while its lease holds, up to and including the lease's last instant.
        assert claims.any_due(ScheduledCommand, due + lease - second) is False
        assert claims.any_due(ScheduledCommand, due + lease) is False
        assert claims.any_due(ScheduledCommand, due + lease + second) is True
        # A lapsed lease on a row out of attempts is nobody's to take.
        db.session.execute(update(ScheduledCommand).values(attempts=ScheduledCommand.max_attempts))
        db.session.commit()
        assert claims.any_due(ScheduledCommand, due + lease + second) is False
        db.session.remove()


def test_any_due_ignores_a_pending_row_out_of_attempts_and_a_done_one(fresh_app):
    with fresh_app.app_context():
        due = utcnow().replace(microsecond=0)
        spent = _command("counting", due)
        _command("counting", due, status="done")
        db.session.execute(
            update(ScheduledCommand).where(ScheduledCommand.id == spent).values(attempts=5, max_attempts=5)
        )
        db.session.commit()

        assert claims.any_due(ScheduledCommand, due + timedelta(hours=1)) is False
        db.session.execute(update(ScheduledCommand).where(ScheduledCommand.id == spent).values(max_attempts=6))
        db.session.commit()
        assert claims.any_due(ScheduledCommand, due + timedelta(hours=1)) is True
        db.session.remove()


def test_count_due_counts_the_pending_rows_of_one_kind_due_by_then(fresh_app):
    with fresh_app.app_context():
        due = utcnow().replace(microsecond=0)
        later = due + timedelta(seconds=10)
        _command("a", due)
        claimed = _command("a", due)
        _command("a", later)
        _command("b", due)
        assert claims.claim(ScheduledCommand, claimed, due, "worker-a")

        counts = [
            claims.count_due(ScheduledCommand, "kind", kind, by)
            for kind, by in [
                ("a", due - timedelta(seconds=1)),
                ("a", due),
                ("a", later),
                ("b", later),
                ("c", later),
            ]
        ]

        assert counts == [0, 1, 2, 1, 0]
        db.session.remove()


def test_next_due_within_names_the_next_pending_row_not_yet_due_inside_the_window(fresh_app):
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        _command("counting", now - timedelta(seconds=5))  # already due: someone else's to claim, not waited for
        _command("counting", now)  # due right now: not "not yet due"
        held = _command("counting", now + timedelta(seconds=0.2))
        assert claims.claim(ScheduledCommand, held, now, "worker-a", early_seconds=1)  # processing: not pending
        _command("counting", now + timedelta(seconds=0.9))
        nearest = now + timedelta(seconds=0.4)
        _command("counting", nearest)

        found = claims.next_due_within(ScheduledCommand, now, 0.5)

        assert found == nearest and found.tzinfo is not None
        assert claims.next_due_within(ScheduledCommand, now, 0.4) == nearest  # the window's end is inside it
        assert claims.next_due_within(ScheduledCommand, now, 0.3) is None
        assert claims.next_due_within(ScheduledCommand, now + timedelta(seconds=0.4), 0.6) == now + timedelta(
            seconds=0.9
        )
        db.session.remove()


@pytest.fixture
def rescheduling(monkeypatch):
    """A command that is not due yet: it asks to run again `wait` after the time it ran at."""
    wait = timedelta(seconds=90)
    seen = []

    def early(row, now):
        seen.append(row.id)
        raise Reschedule(now + wait)

    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "early", early)
    return wait, seen


def test_a_rescheduled_command_is_pending_again_at_its_time_without_spending_the_attempt(fresh_app, rescheduling):
    wait, seen = rescheduling
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        command_id = _command("early", now)
        # Another row this same worker holds: the reschedule hands back its own row only.
        other = _command("counting", now)
        assert claims.claim(ScheduledCommand, other, now, runner.worker_identity())

        assert run_command(command_id, now=now + timedelta(seconds=1)) == runner.RunOutcome.RESCHEDULED

        row = _row(command_id)
        assert seen == [command_id]
        assert (row.status, row.attempts, row.claimed_until) == ("pending", 0, None)
        assert as_utc(row.next_attempt_at) == now + timedelta(seconds=1) + wait
        assert as_utc(row.enqueued_at) == as_utc(row.next_attempt_at)
        assert as_utc(row.updated_at) == now + timedelta(seconds=1)
        assert (_row(other).status, _row(other).attempts) == ("processing", 1)
        # Not due before its time (less the early claim a command job may make): not even claimed.
        early = runner.EARLY_CLAIM_SECONDS + 1
        assert run_command(command_id, now=now + timedelta(seconds=1 - early) + wait) == runner.RunOutcome.SKIPPED
        assert seen == [command_id]
        db.session.remove()


@pytest.mark.parametrize(
    "meanwhile",
    [{"claimed_by": "worker-b", "attempts": 2}, {"status": "done", "attempts": 2}],
    ids=["claimed-by-another", "finished"],
)
def test_a_reschedule_leaves_alone_a_row_that_is_no_longer_ours(fresh_app, monkeypatch, meanwhile):
    """The command's lease lapsed while it ran and another worker claimed the row (or finished it):
    the reschedule must not put that row back to pending."""

    def overtaken(row, now):
        with fresh_app.app_context():  # the other worker, in its own session
            db.session.execute(update(ScheduledCommand).where(ScheduledCommand.id == row.id).values(**meanwhile))
            db.session.commit()
            db.session.remove()
        raise Reschedule(now + timedelta(seconds=90))

    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "overtaken", overtaken)
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        command_id = _command("overtaken", now)

        assert run_command(command_id, now=now + timedelta(seconds=1)) == runner.RunOutcome.RESCHEDULED

        row = _row(command_id)
        expected = {"status": "processing", "claimed_by": runner.worker_identity(), **meanwhile}
        assert (row.status, row.attempts, row.claimed_by) == (expected["status"], 2, expected["claimed_by"])
        assert as_utc(row.next_attempt_at) == now
        db.session.remove()


def test_release_hands_back_only_this_workers_claims_it_names_unspent(fresh_app):
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        mine, also_mine, not_named, theirs, finished = (_command("counting", now) for _ in range(5))
        for command_id in (mine, also_mine, not_named, finished):
            assert claims.claim(ScheduledCommand, command_id, now, "worker-a")
        assert claims.claim(ScheduledCommand, theirs, now, "worker-b")
        assert claims.mark_done(ScheduledCommand, finished, "worker-a", now)
        db.session.commit()
        later = now + timedelta(seconds=3)

        assert claims.release(ScheduledCommand, [mine, also_mine, theirs, finished], "worker-a", later) == 2

        released = [_row(command_id) for command_id in (mine, also_mine)]
        assert {(r.status, r.attempts, r.claimed_by, r.claimed_until) for r in released} == {("pending", 0, None, None)}
        assert {as_utc(r.updated_at) for r in released} == {later}
        assert [(_row(c).status, _row(c).claimed_by) for c in (not_named, theirs, finished)] == [
            ("processing", "worker-a"),
            ("processing", "worker-b"),
            ("done", "worker-a"),
        ]
        assert claims.release(ScheduledCommand, [], "worker-a", later) == 0
        db.session.remove()


def test_a_command_job_claims_its_row_up_to_the_early_claim_before_its_time_and_no_sooner(fresh_app, monkeypatch):
    """rq-scheduler keeps whole seconds and may fire a job up to a second early: a command run by
    id may claim its row EARLY_CLAIM_SECONDS before its time (its handler decides if it is due)."""
    runs = []
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "counting", lambda row, now: runs.append(row.id))
    early = timedelta(seconds=runner.EARLY_CLAIM_SECONDS)
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        on_the_edge = _command("counting", now + early)
        too_soon = _command("counting", now + early + timedelta(seconds=0.5))

        assert run_command(too_soon, now=now) == runner.RunOutcome.SKIPPED
        assert run_command(on_the_edge, now=now) == runner.RunOutcome.DONE

        assert runs == [on_the_edge]
        assert (_row(on_the_edge).status, _row(too_soon).status) == ("done", "pending")
        db.session.remove()


def test_a_claim_takes_a_row_from_its_due_time_and_not_half_a_second_before(fresh_app):
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        soon = _command("counting", now + timedelta(seconds=0.5))

        assert claims.claim(ScheduledCommand, soon, now, "worker-a") is False
        assert claims.claim(ScheduledCommand, soon, now + timedelta(seconds=0.5), "worker-a") is True
        assert (_row(soon).status, _row(soon).claimed_by, _row(soon).attempts) == ("processing", "worker-a", 1)
        db.session.remove()


def test_a_batch_claims_the_deadlines_first_and_with_first_only_nothing_else(fresh_app):
    """The kinds claimed first (claims.CLAIMED_FIRST: an unpaid order's deadline gives stock back)
    go before older work of other kinds; `first_only` claims them alone."""
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        email = _command(CommandKind.SEND_EMAIL, now - timedelta(seconds=30))  # older
        deadline = _command(CommandKind.EXPIRE_UNPAID_ORDER, now)
        other_deadline = _command(CommandKind.EXPIRE_UNPAID_ORDER, now)

        assert claims.claim_batch(ScheduledCommand, now, "worker-a", 1) == [deadline]
        assert claims.claim_batch(ScheduledCommand, now, "worker-a", 10, first_only=True) == [other_deadline]
        assert claims.claim_batch(ScheduledCommand, now, "worker-a", 10, first_only=True) == []
        assert claims.claim_batch(ScheduledCommand, now, "worker-a", 10) == [email]
        db.session.remove()


def test_any_claimed_first_due_sees_a_due_deadline_or_one_whose_lease_lapsed_and_no_other_kind(fresh_app):
    lease = timedelta(seconds=fresh_app.config["OUTBOX_LEASE_SECONDS"])
    second = timedelta(seconds=1)
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        _command(CommandKind.SEND_EMAIL, now - timedelta(seconds=30))  # due, but not a kind claimed first
        deadline = _command(CommandKind.EXPIRE_UNPAID_ORDER, now)

        first_due = lambda by: claims.any_claimed_first_due(ScheduledCommand, by)  # noqa: E731
        assert (first_due(now - second), first_due(now)) == (False, True)
        assert claims.claim(ScheduledCommand, deadline, now, "worker-a")
        assert (first_due(now + lease), first_due(now + lease + second)) == (False, True)
        db.session.remove()


def test_a_claim_stamps_the_row_with_its_worker_its_lease_and_its_own_time(fresh_app):
    lease = timedelta(seconds=fresh_app.config["OUTBOX_LEASE_SECONDS"])
    with fresh_app.app_context():
        due = utcnow().replace(microsecond=0)
        command_id = _command("counting", due)
        at = due + timedelta(seconds=5)
        assert claims.claim(ScheduledCommand, command_id, at, "worker-a")
        row = _row(command_id)
        assert (row.status, row.claimed_by, row.attempts) == ("processing", "worker-a", 1)
        assert as_utc(row.claimed_until) == at + lease
        assert as_utc(row.updated_at) == at
        db.session.remove()


@pytest.mark.parametrize("status", ["done", "dead", "discarded", "obsolete"])
def test_a_finished_row_is_never_claimed_again_even_with_a_lapsed_lease_left_on_it(fresh_app, status):
    # Only a row still processing is taken over when its lease lapses: a finished one whose lease
    # column some writer left set must not run twice.
    with fresh_app.app_context():
        due = utcnow().replace(microsecond=0)
        finished = _command("counting", due, status=status, claimed_by="gone", claimed_until=due)
        later = due + timedelta(hours=1)
        assert claims.any_due(ScheduledCommand, later) is False
        assert claims.claim(ScheduledCommand, finished, later, "worker-a") is False
        assert claims.claim_batch(ScheduledCommand, later, "worker-a", 10) == []
        assert _row(finished).status == status
        db.session.remove()


def test_a_command_run_by_id_runs_the_row_its_claim_returned_without_reading_it_again(fresh_app, monkeypatch):
    # The claim's UPDATE ... RETURNING hands the row over (Work.claim_returns): one statement fewer per command.
    ran = []
    monkeypatch.setitem(shop.scheduling.commands.COMMANDS, "noting", lambda command, now: ran.append(command.id))
    with fresh_app.app_context():
        due = utcnow().replace(microsecond=0)
        command_id = _command("noting", due)
        statements: list[str] = []

        def record(_conn, _cursor, statement, *_args):
            if "scheduled_commands" in statement:
                statements.append(statement.lstrip().split()[0].upper())

        sa_event.listen(db.engine, "before_cursor_execute", record)
        try:
            assert run_command(command_id, now=due + timedelta(seconds=1)) == runner.RunOutcome.DONE
        finally:
            sa_event.remove(db.engine, "before_cursor_execute", record)
        assert ran == [command_id]
        assert statements == ["UPDATE", "UPDATE"]  # the claim, then the guarded "done": no SELECT of the row
        db.session.remove()


def test_due_writers_names_the_traceparents_of_rows_claimable_now_and_at_most_as_many_as_asked(fresh_app):
    # What the poll that wakes a drain links its span to (with tracing on): the writers of the work it wakes for.
    tp = [f"00-{n:032x}-{n:016x}-01" for n in range(1, 6)]
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        _command("counting", now, traceparent=tp[0])  # due
        _command("counting", now)  # due, written outside any span
        _command("counting", now + timedelta(seconds=1), traceparent=tp[1])  # not due yet
        _command("counting", now, traceparent=tp[2], status="processing", claimed_until=now - timedelta(seconds=1))
        _command("counting", now, traceparent=tp[3], status="processing", claimed_until=now + timedelta(seconds=9))
        _command("counting", now, traceparent=tp[4], status="done")
        assert sorted(claims.due_writers(ScheduledCommand, now, 10)) == [tp[0], tp[2]]
        [one] = claims.due_writers(ScheduledCommand, now, 1)
        assert one in (tp[0], tp[2])
        db.session.remove()


@pytest.mark.parametrize("status", ["pending", "done", "dead"])
def test_a_lapsed_lease_makes_only_a_processing_row_claimable_again(fresh_app, status):
    """Every way out of `processing` clears claimed_until, so only a claim that died holds a lapsed
    one; a row that is not due yet, or finished, whose column still holds a past lease (an older
    release's retry, an operator's hand-fix) is not taken by it: not early, and not twice."""
    with fresh_app.app_context():
        now = utcnow().replace(microsecond=0)
        later = _command("counting", now + timedelta(hours=1), status=status, claimed_until=now - timedelta(hours=1))
        died = _command("counting", now, status="processing", claimed_until=now - timedelta(seconds=1), attempts=1)

        assert claims.claim(ScheduledCommand, later, now, "worker-a") is False
        assert claims.claim_batch(ScheduledCommand, now, "worker-a", 10) == [died]
        assert (_row(later).status, _row(later).attempts) == (status, 0)
        db.session.remove()
