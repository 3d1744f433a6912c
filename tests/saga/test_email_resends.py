"""An operator's resend of an email an order was sent, against the real database: once per
submission, only an email the order had, and never one that would now say something the order
has moved past (a payment-failed email for an order back at the payment page)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from compensation_support import cancel
from factories import force_order, place_order_for, seed_catalog_rows
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import EmailResend, Order, OutboxDelivery, ScheduledCommand, WorkStatus
from shop.outbox import schedule_command, uow
from shop.outbox.dispatch import run_command, run_delivery
from shop.saga import email_resends
from shop.saga.email_resends import ResendOutcome, resend_email, sent_emails
from support import first_look_misses

OPERATOR = "night-shift@example.com"


@pytest.fixture
def failed_payment_email(mail_folder, make_fresh_app):
    """An order in PaymentFailed that was sent its payment-failed email (the command ran): its id."""
    app = make_fresh_app()
    with app.app_context():
        yield _failed_payment_email()
        db.session.remove()


def mails(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("*.eml")) if folder.is_dir() else []


def _failed_payment_email() -> int:
    seed_catalog_rows()
    placed = place_order_for()
    force_order(placed.order_id, status="PaymentFailed")
    with uow.transaction() as session:
        command = schedule_command(
            session, "send_email", utcnow(), order_id=placed.order_id, payload={"template": "payment_failed"}
        )
    assert run_command(command, now=utcnow()) == "done"
    return placed.order_id


def _resends(order_id):
    db.session.rollback()
    return db.session.execute(select(EmailResend).where(EmailResend.order_id == order_id)).scalars().all()


def test_an_email_the_order_had_is_sent_again_once_per_submission(failed_payment_email, mail_folder, caplog):
    oid = failed_payment_email
    reference = db.session.get(Order, oid).reference
    assert len(mails(mail_folder)) == 1
    assert [e.template for e in sent_emails(oid)] == ["payment_failed"]
    asked_at = utcnow().replace(microsecond=0) - timedelta(minutes=3)
    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        first = resend_email(oid, "payment_failed", operator=OPERATOR, request_key="key-resend-000000001", now=asked_at)
    again = resend_email(oid, "payment_failed", operator=OPERATOR, request_key="key-resend-000000001")
    assert (first.outcome, again.outcome) == (ResendOutcome.DONE, ResendOutcome.ALREADY)
    assert again.command_id == first.command_id
    said = f"order {reference}: {OPERATOR} sent the payment_failed email again (cmd-{first.command_id})"
    assert [r.getMessage() for r in caplog.records if r.name == "shop.saga"] == [said]
    [resend] = _resends(oid)
    command = db.session.get(ScheduledCommand, resend.command_id)
    assert (command.kind, command.payload, command.status) == (
        "send_email",
        {"template": "payment_failed", "resent_by": OPERATOR},
        "pending",
    )
    # Both rows carry the time of the operator's submission, which the console shows.
    assert (as_utc(resend.created_at), as_utc(command.created_at)) == (asked_at, asked_at)
    assert run_command(command.id, now=utcnow()) == "done"
    assert len(mails(mail_folder)) == 2 and all("payment_failed" in name for name in mails(mail_folder))
    assert [(e.via, e.resent_by) for e in sent_emails(oid)] == [("command", None), ("command", OPERATOR)]


def test_an_email_the_order_never_had_is_not_sent(failed_payment_email):
    result = resend_email(failed_payment_email, "order_paid", operator=OPERATOR, request_key="key-resend-000000002")
    assert (result.outcome, result.why, result.command_id) == (ResendOutcome.REFUSED, "not_sent", None)
    assert _resends(failed_payment_email) == []


def test_a_resend_for_an_order_that_does_not_exist_is_answered_missing_and_sends_nothing(failed_payment_email):
    gone = failed_payment_email + 1000
    result = resend_email(gone, "payment_failed", operator=OPERATOR, request_key="key-resend-000000006")
    assert (result.outcome, result.command_id) == (ResendOutcome.MISSING, None)
    assert _resends(gone) == []


def test_an_email_that_is_no_longer_true_is_not_sent_again(failed_payment_email):
    force_order(failed_payment_email, status="PaymentInitiated")  # the customer went back to pay
    result = resend_email(failed_payment_email, "payment_failed", operator=OPERATOR, request_key="key-resend-000000003")
    assert (result.outcome, result.why) == (ResendOutcome.REFUSED, "no_longer_true")
    assert _resends(failed_payment_email) == []


def test_a_resend_to_another_address_names_it_in_the_command_and_not_on_the_order(failed_payment_email, caplog):
    order_email = db.session.get(Order, failed_payment_email).email
    with caplog.at_level(logging.WARNING, logger="shop.saga"):
        result = resend_email(
            failed_payment_email,
            "payment_failed",
            operator=OPERATOR,
            request_key="key-resend-000000004",
            to="x@example.org",
        )
    assert result.outcome is ResendOutcome.DONE
    [line] = [r.getMessage() for r in caplog.records if r.name == "shop.saga"]
    reference = db.session.get(Order, failed_payment_email).reference
    said = f"{OPERATOR} sent the payment_failed email again to another address (cmd-{result.command_id})"
    assert line == f"order {reference}: {said}"
    command = db.session.get(ScheduledCommand, result.command_id)
    assert command.payload == {"template": "payment_failed", "resent_by": OPERATOR, "to": "x@example.org"}
    assert db.session.get(Order, failed_payment_email).email == order_email


def test_a_resend_whose_key_another_submission_committed_after_its_check_answers_with_that_one(
    failed_payment_email, monkeypatch
):
    # The winner commits between the loser's look for an earlier resend and its insert: the insert is
    # refused by the key's unique index, and the loser answers with the winner's resend, sending nothing more.
    oid, key = failed_payment_email, "key-resend-000000005"
    winner = resend_email(oid, "payment_failed", operator=OPERATOR, request_key=key)
    looks = first_look_misses(monkeypatch, email_resends)
    loser = resend_email(oid, "payment_failed", operator=OPERATOR, request_key=key)

    assert (loser.outcome, loser.command_id, looks) == (ResendOutcome.ALREADY, winner.command_id, [key, key])
    assert [r.command_id for r in _resends(oid)] == [winner.command_id]


def test_a_cancellation_notice_sent_by_its_delivery_is_listed_under_why_the_order_ended(fresh_app, tmp_path):
    fresh_app.instance_path = str(tmp_path)  # its mail in this test's own folder
    with fresh_app.app_context():
        seed_catalog_rows()
        order_id = place_order_for().order_id
        cancel(order_id)  # the customer's own: the notice is "order_cancelled"
        delivery_id = db.session.execute(
            select(OutboxDelivery.id).where(
                OutboxDelivery.order_id == order_id, OutboxDelivery.handler == "send_cancellation_email"
            )
        ).scalar_one()
        assert run_delivery(delivery_id) == "done"
        went = db.session.get(OutboxDelivery, delivery_id).completed_at
        assert [(e.template, e.name, e.sent_at, e.via, e.work_id) for e in sent_emails(order_id)] == [
            ("order_cancelled", email_resends.EMAIL_NAMES["order_cancelled"], went, "event", delivery_id)
        ]
        db.session.remove()


def _run_deliveries(order_id: int) -> None:
    """Every pending delivery of the order's events, run now (as a worker would)."""
    db.session.rollback()
    pending = select(OutboxDelivery.id).where(
        OutboxDelivery.order_id == order_id, OutboxDelivery.status == WorkStatus.PENDING
    )
    for delivery_id in db.session.execute(pending.order_by(OutboxDelivery.id)).scalars().all():
        assert run_delivery(delivery_id) == "done"


def _placed_email(order_id: int) -> int:
    return db.session.execute(
        select(OutboxDelivery.id).where(
            OutboxDelivery.order_id == order_id, OutboxDelivery.handler == "send_order_placed_email"
        )
    ).scalar_one()


def test_each_order_lists_its_own_emails_once_and_only_those_that_went(fresh_app, tmp_path):
    """Another order's emails and settling are not this one's; the work of an event that sends no
    email (the restore) is not an email; a placed email run after the order ended sent nothing and
    hides nothing after it."""
    fresh_app.instance_path = str(tmp_path)
    with fresh_app.app_context():
        seed_catalog_rows()
        first, second, late = (place_order_for().order_id for _ in range(3))
        assert run_delivery(_placed_email(first)) == "done"
        cancel(first)
        _run_deliveries(first)  # its restore and its cancellation notice
        _run_deliveries(second)  # its placed email, after the first order was cancelled
        cancel(late)  # before its placed email ran: that one sends nothing
        _run_deliveries(late)

        assert [(e.template, e.via) for e in sent_emails(first)] == [
            ("order_placed", "event"),
            ("order_cancelled", "event"),
        ]
        assert [e.template for e in sent_emails(second)] == ["order_placed"]
        assert [e.template for e in sent_emails(late)] == ["order_cancelled"]
        db.session.remove()


def test_the_emails_list_names_each_email_when_it_went_and_the_work_that_sent_it(failed_payment_email):
    """Only the order's own send_email commands that ran are emails it had, each with its name, the
    time it went and the command that sent it, oldest first whatever the commands' ids."""
    oid = failed_payment_email
    [first] = sent_emails(oid)
    other = place_order_for().order_id
    with uow.transaction() as session:
        waiting = schedule_command(
            session, "send_email", utcnow(), order_id=oid, payload={"template": "payment_failed"}
        )
        later = schedule_command(session, "send_email", utcnow(), order_id=oid, payload={"template": "payment_failed"})
        elsewhere = schedule_command(
            session, "send_email", utcnow(), order_id=other, payload={"template": "payment_failed"}
        )
    assert run_command(later, now=utcnow()) == "done" and run_command(elsewhere, now=utcnow()) == "done"
    went = {first.work_id: utcnow() - timedelta(minutes=1), later: utcnow() - timedelta(minutes=2)}
    for command_id, at in went.items():  # the later command (a higher id) went first
        db.session.execute(update(ScheduledCommand).where(ScheduledCommand.id == command_id).values(completed_at=at))
    db.session.commit()

    listed = [(e.template, e.name, as_utc(e.sent_at), e.via, e.work_id, e.resent_by) for e in sent_emails(oid)]

    name = email_resends.EMAIL_NAMES["payment_failed"]
    assert listed == [
        ("payment_failed", name, went[later], "command", later, None),
        ("payment_failed", name, went[first.work_id], "command", first.work_id, None),
    ]
    assert waiting not in [e.work_id for e in sent_emails(oid)]
