"""Deadlines at the provider falling due together: one read of the provider's event list tells the
whole group which sessions expired (shop.payments.expiry_reads), and only a session it left open
is asked about alone. No webhook reaches these apps (none is registered at the sandbox): the
deadlines are what cancels the orders. Real database, Redis and sandbox; time is injected."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from factories import on_hand, place_order_for, seed_catalog_rows
from shop.domain.deadlines import as_utc, utcnow
from shop.extensions import db
from shop.models import CommandKind, Order, ScheduledCommand
from shop.outbox.dispatch import run_command
from shop.payments import expiry_reads
from shop.payments.start import start_payment
from shop.queue.connection import redis_conn

pytestmark = pytest.mark.usefixtures("no_order_placed_email")

GROUP = 24  # more than BULK_THRESHOLD, fewer than one page of events


@pytest.fixture
def paying_ctx(make_fresh_app, sandbox):
    # Starting two dozen sessions at once is the test's setup, not what it measures: the budget is lifted.
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=1000
    )
    with app.app_context():
        yield app
        db.session.remove()


def _orders_at_the_payment_page(count: int, placed_at) -> list[tuple[int, int, str]]:
    """`count` orders of one unit each, placed at `placed_at`, whose customers went to the hosted
    page at once (their sessions all end at the same instant); (order id, deadline id, session id)."""
    skus = seed_catalog_rows()
    units = {sku: on_hand(sku) for sku in skus}
    picks = [sku for sku, n in sorted(units.items()) for _ in range(n)][:count]
    assert len(picks) == count, "the demo catalog holds too few units for this test"
    placed = []
    for sku in picks:
        order_id = place_order_for({sku: 1}, now=placed_at).order_id
        assert start_payment(order_id, now=placed_at).status == "started"
        deadline_id = db.session.execute(
            select(ScheduledCommand.id).where(
                ScheduledCommand.kind == CommandKind.EXPIRE_UNPAID_ORDER, ScheduledCommand.order_id == order_id
            )
        ).scalar_one()
        placed.append((order_id, deadline_id, db.session.get(Order, order_id).payment_session_id))
        db.session.rollback()
    return placed


def _session_ends(order_id: int):
    db.session.expire_all()
    ends = as_utc(db.session.get(Order, order_id).payment_session_expires_at)
    db.session.rollback()
    return ends


def _statuses(placed) -> list[str]:
    db.session.expire_all()
    statuses = [db.session.get(Order, order_id).status for order_id, _, _ in placed]
    db.session.rollback()
    return statuses


def test_a_group_of_deadlines_learns_its_sessions_expired_from_one_read_of_the_event_list(paying_ctx, sandbox):
    placed = _orders_at_the_payment_page(GROUP, utcnow())
    ends = _session_ends(placed[0][0])
    assert {_session_ends(order_id) for order_id, _, _ in placed} == {ends}
    sandbox.advance_clock((ends - utcnow()).total_seconds() + 1)  # the provider expires them all
    before = sandbox.requests()

    at = ends + expiry_reads.EXPIRY_GRACE
    assert [run_command(deadline_id, now=at) for _, deadline_id, _ in placed] == ["done"] * GROUP

    assert _statuses(placed) == ["Cancelled"] * GROUP
    calls = [(c["method"], c["path"]) for c in sandbox.requests()[len(before) :]]
    assert calls == [("GET", "/v1/events")]  # one page for the whole group, not a retrieve each


def test_a_session_the_read_did_not_list_as_expired_is_asked_about_alone_and_a_payment_made_in_time_wins(
    paying_ctx, sandbox
):
    placed = _orders_at_the_payment_page(GROUP, utcnow())
    paid_order, paid_deadline, paid_session = placed[-1]
    sandbox.set_outcome(paid_session, "paid")  # its webhook never reaches this app
    ends = _session_ends(paid_order)
    sandbox.advance_clock((ends - utcnow()).total_seconds() + 1)
    before = sandbox.requests()

    at = ends + expiry_reads.EXPIRY_GRACE
    assert [run_command(deadline_id, now=at) for _, deadline_id, _ in placed] == ["done"] * GROUP

    assert _statuses(placed) == ["Cancelled"] * (GROUP - 1) + ["Paid"]
    paths = [c["path"] for c in sandbox.requests()[len(before) :]]
    assert paths.count("/v1/events") == 1
    assert [p for p in paths if p.startswith("/v1/checkout/sessions")] == [f"/v1/checkout/sessions/{paid_session}"]


def test_a_card_payment_held_in_time_is_asked_about_alone_and_authorizes_its_order(make_fresh_app, sandbox):
    """CAPTURE_MODE=dispatch: the read lists the held session completed and unpaid, with no payment
    to tell a hold from a bank still paying; its deadline asks alone, and the order is Authorized."""
    app = make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_SESSION_MIN_SECONDS=60,
        STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=1000,
        CAPTURE_MODE="dispatch",
    )
    with app.app_context():
        placed = _orders_at_the_payment_page(GROUP, utcnow())
        held_order, _, held_session = placed[-1]
        assert sandbox.set_outcome(held_session, "paid")["payment_status"] == "unpaid"
        ends = _session_ends(held_order)
        sandbox.advance_clock((ends - utcnow()).total_seconds() + 1)

        at = ends + expiry_reads.EXPIRY_GRACE
        assert [run_command(deadline_id, now=at) for _, deadline_id, _ in placed] == ["done"] * GROUP

        assert _statuses(placed) == ["Cancelled"] * (GROUP - 1) + ["Authorized"]
        db.session.remove()


def test_fewer_deadlines_than_a_group_each_ask_the_provider_alone(paying_ctx, sandbox):
    placed = _orders_at_the_payment_page(expiry_reads.BULK_THRESHOLD - 1, utcnow())
    ends = _session_ends(placed[0][0])
    sandbox.advance_clock((ends - utcnow()).total_seconds() + 1)
    before = sandbox.requests()

    at = ends + expiry_reads.EXPIRY_GRACE
    assert {run_command(deadline_id, now=at) for _, deadline_id, _ in placed} == {"done"}

    paths = [c["path"] for c in sandbox.requests()[len(before) :]]
    assert "/v1/events" not in paths
    assert sorted(paths) == sorted(f"/v1/checkout/sessions/{sid}" for _, _, sid in placed)


def test_a_deadline_waits_briefly_for_the_read_another_process_is_making_instead_of_asking(paying_ctx, sandbox):
    placed = _orders_at_the_payment_page(GROUP, utcnow())
    order_id, deadline_id, _ = placed[0]
    ends = _session_ends(order_id)
    sandbox.advance_clock((ends - utcnow()).total_seconds() + 1)
    redis_conn().set(expiry_reads._key("reader"), "another process", px=expiry_reads.CLAIM_MS)
    before = sandbox.requests()

    at = ends + expiry_reads.EXPIRY_GRACE
    assert run_command(deadline_id, now=at) == "rescheduled"

    db.session.expire_all()
    row = db.session.get(ScheduledCommand, deadline_id)
    assert (row.status, as_utc(row.next_attempt_at)) == ("pending", at + expiry_reads.WAIT_FOR_READER)
    db.session.rollback()
    assert sandbox.requests()[len(before) :] == []


def _pending_at(deadline_id: int):
    db.session.expire_all()
    row = db.session.get(ScheduledCommand, deadline_id)
    found = (row.status, as_utc(row.next_attempt_at))
    db.session.rollback()
    return found


def test_a_group_reads_again_until_the_provider_expires_its_sessions_instead_of_waiting_out_a_fixed_grace(
    paying_ctx, sandbox
):
    placed = _orders_at_the_payment_page(GROUP, utcnow())
    ends = _session_ends(placed[0][0])
    before = sandbox.requests()

    # First look: the provider has not expired the sessions yet (its clock is still before their end).
    first = ends + expiry_reads.FIRST_LOOK
    assert [run_command(deadline_id, now=first) for _, deadline_id, _ in placed] == ["rescheduled"] * GROUP
    assert {_pending_at(deadline_id) for _, deadline_id, _ in placed} == {("pending", first + expiry_reads.REREAD)}
    assert [c["path"] for c in sandbox.requests()[len(before) :]] == ["/v1/events"]  # one read for all of them

    sandbox.advance_clock((ends - utcnow()).total_seconds() + 1)  # now the provider expires them
    again = first + expiry_reads.REREAD
    assert again < ends + expiry_reads.EXPIRY_GRACE  # sooner than a lone deadline would ask
    assert [run_command(deadline_id, now=again) for _, deadline_id, _ in placed] == ["done"] * GROUP

    assert _statuses(placed) == ["Cancelled"] * GROUP
    assert [c["path"] for c in sandbox.requests()[len(before) :]] == ["/v1/events", "/v1/events"]


def test_a_session_the_group_reads_never_list_is_asked_about_alone_after_the_groups_patience(paying_ctx, sandbox):
    placed = _orders_at_the_payment_page(GROUP, utcnow())
    order_id, deadline_id, session_id = placed[0]
    ends = _session_ends(order_id)
    before = sandbox.requests()

    # The provider still has the session open long after its end: no read lists it, so it asks alone.
    assert run_command(deadline_id, now=ends + expiry_reads.GROUP_PATIENCE) == "rescheduled"

    assert [c["path"] for c in sandbox.requests()[len(before) :]] == [f"/v1/checkout/sessions/{session_id}"]
    assert _statuses(placed[:1]) == ["PaymentInitiated"]
