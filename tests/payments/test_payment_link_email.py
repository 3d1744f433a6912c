"""An order placed while the provider was down (its payment could not start at checkout) is
emailed its payment link once payments work again: one durable command per such order, waiting
for the provider without spending attempts, sending once, and only while the order still waits
for its first payment page. Real database, Redis and the sandbox over HTTP."""

from __future__ import annotations

import email
import os

import pytest
from sqlalchemy import select

from factories import seed_catalog_rows
from payment_helpers import Shopper, order_id
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import ScheduledCommand
from shop.outbox.dispatch import run_command, wake_provider_waiters
from support import wait_until


@pytest.fixture
def app(make_fresh_app, sandbox, monkeypatch, tmp_path):
    """A paying app whose instance folder (where mail is written without SMTP) is this test's own."""
    monkeypatch.setenv("BACKSTOP_INSTANCE_PATH", str(tmp_path / "instance"))
    monkeypatch.delenv("SMTP_URL", raising=False)
    return make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60, STRIPE_WEBHOOK_SECRET="whsec_test_secret"
    )


@pytest.fixture
def shopper(app):
    return Shopper(app, seed_catalog_rows(app))


def _commands(app, oid: int) -> list[ScheduledCommand]:
    with app.app_context():
        rows = (
            db.session.execute(
                select(ScheduledCommand)
                .where(ScheduledCommand.order_id == oid, ScheduledCommand.kind == "offer_payment_link")
                .order_by(ScheduledCommand.id)
            )
            .scalars()
            .all()
        )
        db.session.expunge_all()
        db.session.remove()
        return rows


def _run(app, command_id: int) -> str:
    with app.app_context():
        now = utcnow()
        wake_provider_waiters(now)  # what the breaker's recovery and the sweep do
        outcome = run_command(command_id, now=now)
        db.session.remove()
        return outcome


def _mails(app) -> list[str]:
    folder = os.path.join(app.instance_path, "mail")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _placed_while_down(shopper, sandbox) -> str:
    sandbox.faults(api_unavailable=True)
    r = shopper.checkout("MUG-350-SND", 1)
    assert r.status_code == 303 and "/orders/" in r.headers["Location"]
    return r.headers["Location"].rsplit("/", 1)[-1]


def test_an_order_placed_while_the_provider_was_down_is_emailed_its_link_once_payments_work(app, shopper, sandbox):
    ref = _placed_while_down(shopper, sandbox)
    oid = order_id(app, ref)
    [command] = _commands(app, oid)

    # Still down: the command waits for the provider, spending no attempt, and sends nothing.
    assert _run(app, command.id) == "waiting"
    [waiting] = _commands(app, oid)
    assert (waiting.status, waiting.attempts, waiting.failure_kind) == ("pending", 0, "provider")
    assert _mails(app) == []

    sandbox.faults(api_unavailable=False)
    assert _run(app, command.id) == "done"
    assert _mails(app) == [f"{ref}-payment_link.eml"]
    with open(os.path.join(app.instance_path, "mail", f"{ref}-payment_link.eml"), "rb") as fh:
        message = email.message_from_binary_file(fh)
    assert message["To"] == shopper.email
    assert message["Subject"] == f"You can pay for order {ref} now"
    body = message.get_payload(decode=True).decode()
    assert "Payments work again now." in body and 'choose "Pay now"' in body
    assert f"/orders/{ref}?token=" in body

    # The link opens the order for whoever has the email (its token), and it is still payable.
    link = next(line for line in body.splitlines() if f"/orders/{ref}?token=" in line).strip()
    stranger = Shopper(app, shopper.skus)
    token = link.split("token=", 1)[1]
    assert stranger.get_order(ref, token=token).get_json()["status"] == "PendingPayment"

    # Sent once: the command is done, and running it again sends nothing more.
    assert _run(app, command.id) == "skipped"
    assert _mails(app) == [f"{ref}-payment_link.eml"] and _commands(app, oid)[0].status == "done"


def test_an_order_the_customer_paid_for_meanwhile_gets_no_payment_link(app, shopper, sandbox):
    ref = _placed_while_down(shopper, sandbox)
    [command] = _commands(app, order_id(app, ref))
    sandbox.faults(api_unavailable=False)
    assert shopper.pay(ref).status_code == 200  # "Pay now" worked first

    assert _run(app, command.id) == "done"
    assert _mails(app) == []


def test_a_cancelled_order_gets_no_payment_link(app, shopper, sandbox):
    ref = _placed_while_down(shopper, sandbox)
    [command] = _commands(app, order_id(app, ref))
    assert shopper.cancel(ref, shopper.order(ref)["version"]).status_code == 200
    sandbox.faults(api_unavailable=False)

    assert _run(app, command.id) == "done"
    assert _mails(app) == []


def test_a_checkout_whose_payment_started_or_a_failed_pay_now_schedules_no_link(app, shopper, sandbox):
    started = shopper.place()
    assert _commands(app, order_id(app, started["reference"])) == []

    ref = _placed_while_down(shopper, sandbox)
    assert shopper.pay(ref).status_code == 503  # still down: "Pay now" fails too
    assert len(_commands(app, order_id(app, ref))) == 1  # only the checkout's


def test_after_an_outage_the_links_take_the_breakers_verdict_and_ask_the_provider_nothing(app, shopper, sandbox):
    """Orders placed while the provider refused every call opened the breaker; once its one probe
    found the provider answering again, every order's payment-link command sends on that verdict:
    no command asks the provider again (one call per order before)."""
    from shop.provider import guard

    # Six customers (more failures than the breaker's threshold), each with a browser of their own.
    refs = [_placed_while_down(Shopper(app, shopper.skus), sandbox) for _ in range(6)]
    with app.app_context():
        assert guard.get().breaker_view()["state"] != "closed"
    sandbox.faults(api_unavailable=False)
    with app.app_context():
        wait_until(lambda: guard.get().breaker_view()["state"] == "closed", 15, "the breaker's probe to close it")
    before = len(sandbox.requests())

    commands = [command for ref in refs for command in _commands(app, order_id(app, ref))]
    assert [_run(app, command.id) for command in commands] == ["done"] * len(refs)

    assert sandbox.requests()[before:] == []
    assert _mails(app) == sorted(f"{ref}-payment_link.eml" for ref in refs)
