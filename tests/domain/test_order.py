"""The pure domain, without Flask or a database: the order's state machine (docs/REFERENCE.md, Order states),
the inventory_restored marker, PaymentProof and the deadline arithmetic."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

import pytest

from shop.domain.deadlines import SESSION_SLACK_SECONDS as SLACK
from shop.domain.deadlines import (
    as_utc,
    retry_delay_seconds,
    session_expires_at,
    session_pay_by,
    unpaid_deadline,
    unpaid_hold_seconds,
)
from shop.domain.events import (
    OrderAuthorized,
    OrderCancelled,
    OrderPaid,
    OrderPaymentFailed,
    OrderPlaced,
    OrderShipped,
    PaymentInitiated,
    event_from_payload,
)
from shop.domain.order import (
    CANCELLED_BY_CUSTOMER,
    PAYMENT_WINDOW_EXPIRED,
    CancelledBy,
    OrderRules,
    OrderStatus,
    cancelled_because,
)
from shop.domain.payment import NO_TAX_REPORTED, SessionTax, TaxMode, charged_tax, check_payment_proof
from shop.domain.results import Ok, Refused

S = OrderStatus
ALL_STATES = list(OrderStatus)


@dataclass(eq=False)
class PlainOrder(OrderRules):
    """The smallest thing that can carry the rules: plain attributes, no mapper."""

    id: int = 7
    status: OrderStatus = S.PENDING_PAYMENT
    inventory_restored: bool = False
    payment_session_id: str | None = None
    payment_session_url: str | None = None
    shipped_at: datetime | None = None
    tracking: str | None = None


def order_in(state: OrderStatus, session_id: str | None = "cs_old") -> PlainOrder:
    return PlainOrder(status=state, payment_session_id=session_id)


# transition -> (call, {from-state: (to-state, event) | refusal code})
TRANSITIONS = {
    "start_payment": (
        lambda o: o.start_payment("cs_new", "https://pay/cs_new"),
        {
            S.PENDING_PAYMENT: (S.PAYMENT_INITIATED, PaymentInitiated(7, "cs_new")),
            S.PAYMENT_FAILED: (S.PAYMENT_INITIATED, PaymentInitiated(7, "cs_new")),
            S.PAYMENT_INITIATED: "invalid_transition",
            S.AUTHORIZED: "invalid_transition",
            S.PAID: "order_already_paid",
            S.CANCELLED: "order_already_cancelled",
        },
    ),
    "mark_paid": (
        lambda o: o.mark_paid("cs_new", 3600, "usd"),
        {
            S.PAYMENT_INITIATED: (S.PAID, OrderPaid(7, "cs_new", 3600, "usd")),
            # CAPTURE_MODE=dispatch: the hold captured when the order ships.
            S.AUTHORIZED: (S.PAID, OrderPaid(7, "cs_new", 3600, "usd")),
            S.PENDING_PAYMENT: "invalid_transition",
            S.PAYMENT_FAILED: "invalid_transition",
            S.PAID: "order_already_paid",
            S.CANCELLED: "order_already_cancelled",
        },
    ),
    "mark_authorized": (
        lambda o: o.mark_authorized("cs_new", 3600, "usd"),
        {
            S.PAYMENT_INITIATED: (S.AUTHORIZED, OrderAuthorized(7, "cs_new", 3600, "usd")),
            S.PENDING_PAYMENT: "invalid_transition",
            S.PAYMENT_FAILED: "invalid_transition",
            S.AUTHORIZED: "invalid_transition",
            S.PAID: "order_already_paid",
            S.CANCELLED: "order_already_cancelled",
        },
    ),
    "mark_payment_failed": (
        lambda o: o.mark_payment_failed("card_declined"),
        {
            S.PAYMENT_INITIATED: (S.PAYMENT_FAILED, OrderPaymentFailed(7, "cs_old", "card_declined")),
            S.AUTHORIZED: "invalid_transition",
            S.PENDING_PAYMENT: "invalid_transition",
            S.PAYMENT_FAILED: "invalid_transition",
            S.PAID: "order_already_paid",
            S.CANCELLED: "order_already_cancelled",
        },
    ),
    "cancel": (
        lambda o: o.cancel("customer asked"),
        {
            S.PENDING_PAYMENT: (S.CANCELLED, OrderCancelled(7, "customer asked")),
            S.PAYMENT_INITIATED: (S.CANCELLED, OrderCancelled(7, "customer asked")),
            S.PAYMENT_FAILED: (S.CANCELLED, OrderCancelled(7, "customer asked")),
            # Its hold is voided, never refunded (payments.holds).
            S.AUTHORIZED: (S.CANCELLED, OrderCancelled(7, "customer asked")),
            S.PAID: "order_already_paid",
            S.CANCELLED: "order_already_cancelled",
        },
    ),
}

CASES = [(name, state) for name in TRANSITIONS for state in ALL_STATES]


def test_the_table_covers_every_transition_from_every_state():
    for name, (_, outcomes) in TRANSITIONS.items():
        assert set(outcomes) == set(ALL_STATES), name


@pytest.mark.parametrize("name,state", CASES, ids=[f"{n}-from-{s.value}" for n, s in CASES])
def test_a_transition_moves_the_order_and_records_its_event_only_where_the_contract_allows(name, state):
    call, outcomes = TRANSITIONS[name]
    order = order_in(state)
    expected = outcomes[state]
    result = call(order)
    if isinstance(expected, tuple):
        to_state, event = expected
        assert isinstance(result, Ok) and result.ok
        assert result.events == (event,)
        assert order.status is to_state
        assert order.can(name) is False  # no transition applies twice in a row
        assert name == "start_payment" or order.payment_session_id == (
            "cs_new" if name in ("mark_paid", "mark_authorized") else "cs_old"
        )
    else:
        assert isinstance(result, Refused) and not result.ok
        assert result.code == expected
        assert result.details == {"transition": name, "status": state.value}
        assert state.value in result.message
        # A refusal is a value: nothing changed, and it carries no events to save.
        assert order.status is state
        assert order.payment_session_id == "cs_old"
        assert not hasattr(result, "events")
        assert order.can(name) is False


def test_start_payment_records_the_new_session_on_the_order():
    order = order_in(S.PAYMENT_FAILED)
    order.start_payment("cs_2", "https://pay/cs_2")
    assert (order.payment_session_id, order.payment_session_url) == ("cs_2", "https://pay/cs_2")


def test_a_failed_payment_can_be_retried_and_then_paid_recording_every_event_in_order():
    order = order_in(S.PENDING_PAYMENT, None)
    results = [
        order.start_payment("cs_1"),
        order.mark_payment_failed("declined"),
        order.start_payment("cs_2"),
        order.mark_paid("cs_2", 100, "usd"),
    ]
    assert all(r.ok for r in results)
    events = [e for r in results for e in r.events]
    assert [e.name for e in events] == [
        "PaymentInitiated",
        "OrderPaymentFailed",
        "PaymentInitiated",
        "OrderPaid",
    ]
    assert events[1] == OrderPaymentFailed(7, "cs_1", "declined")
    assert order.status == "Paid"


def test_a_cancelled_order_keeps_the_reason_it_was_cancelled_for():
    order = order_in(S.PAYMENT_FAILED)
    assert order.cancel("payment window expired").ok
    assert order.cancel_reason == "payment window expired"


def test_an_order_is_never_both_paid_and_cancelled():
    paid = order_in(S.PAYMENT_INITIATED)
    assert paid.mark_paid("cs", 1, "usd").ok and paid.cancel("late").code == "order_already_paid"
    cancelled = order_in(S.PAYMENT_INITIATED)
    assert cancelled.cancel("x").ok and cancelled.mark_paid("cs", 1, "usd").code == "order_already_cancelled"


@pytest.mark.parametrize("state", [s for s in ALL_STATES if s is not S.CANCELLED], ids=lambda s: s.value)
def test_inventory_cannot_be_marked_restored_on_an_order_that_is_not_cancelled(state):
    order = order_in(state)
    result = order.mark_inventory_restored()
    assert isinstance(result, Refused) and result.code == "order_not_cancelled"
    assert result.details == {"status": state.value}
    assert order.inventory_restored is False


def test_inventory_is_marked_restored_once_and_a_second_call_is_refused():
    order = order_in(S.PENDING_PAYMENT)
    assert [e.name for e in order.cancel("x").events] == ["OrderCancelled"]
    first = order.mark_inventory_restored()
    assert isinstance(first, Ok) and first.events == () and order.inventory_restored is True  # the marker: no event
    second = order.mark_inventory_restored()
    assert isinstance(second, Refused) and second.code == "inventory_already_restored"
    assert order.inventory_restored is True


def test_the_status_accepts_the_enum_or_its_contract_spelling():
    order = PlainOrder(status=S.PAYMENT_INITIATED)
    assert order.mark_paid("cs", 1, "usd").ok
    assert str(S.PAYMENT_FAILED) == "PaymentFailed"


@pytest.mark.parametrize(
    "event",
    [
        OrderPlaced(1, "BK-ABCDEFGH", 3600, "usd"),
        PaymentInitiated(1, "cs_1"),
        OrderPaid(1, "cs_1", 3600, "usd"),
        OrderPaymentFailed(1, None, "declined"),
        OrderCancelled(1, "expired"),
    ],
    ids=lambda e: e.name,
)
def test_an_event_survives_its_outbox_payload(event):
    assert event_from_payload(event.name, event.payload()) == event


# -- PaymentProof ------------------------------------------------------------------------------

PROOFS = [
    # (amount_total, currency, payment_status, accepted, problem fragments)
    (3600, "usd", "paid", True, []),
    (3600, "USD", "paid", True, []),
    (3599, "usd", "paid", False, ["amount_total 3599 != order total 3600"]),
    (3600, "eur", "paid", False, ["currency 'eur'"]),
    (3600, None, "paid", False, ["currency None"]),
    (3600, "usd", "unpaid", False, ["payment_status is 'unpaid'"]),
    (3600, "usd", "no_payment_required", False, ["'no_payment_required'"]),
    (None, "usd", "paid", False, ["amount_total None"]),
    (1, "gbp", "unpaid", False, ["payment_status", "amount_total 1", "currency 'gbp'"]),
]


@pytest.mark.parametrize("amount,currency,status,accepted,problems", PROOFS)
def test_payment_proof_needs_paid_status_the_exact_amount_and_the_currency(
    amount, currency, status, accepted, problems
):
    verdict = check_payment_proof(
        order_total=3600, order_currency="usd", amount_total=amount, currency=currency, payment_status=status
    )
    assert verdict.accepted is accepted
    assert len(verdict.problems) == len(problems)
    for fragment, problem in zip(problems, verdict.problems, strict=True):
        assert fragment in problem
    assert verdict.describe() == ("accepted" if accepted else "; ".join(verdict.problems))


NO_TAX = SessionTax(enabled=False, status=None, amount_subtotal=3600, amount_tax=0)
TAXED = SessionTax(enabled=True, status="complete", amount_subtotal=3600, amount_tax=288)
TAXED_PROOFS = [
    # (what the session says, amount_total, tax mode, the problems' fragments)
    (NO_TAX, 3600, TaxMode.NONE, []),
    (NO_TAX_REPORTED, 3600, TaxMode.NONE, []),
    # An account that calculates tax by default charged more than the order: never Paid.
    (TAXED, 3888, TaxMode.NONE, ["amount_total 3888 != order total 3600", "calculated tax"]),
    # Even when the tax came out as zero, a calculation the shop did not ask for is refused.
    (replace(TAXED, amount_tax=0), 3600, TaxMode.NONE, ["calculated tax"]),
    (replace(NO_TAX, amount_subtotal=3000), 3600, TaxMode.NONE, ["amount_subtotal 3000 != order total 3600"]),
    (TAXED, 3888, TaxMode.STRIPE, []),
    (replace(TAXED, amount_tax=0), 3600, TaxMode.STRIPE, []),  # a country without tax
    (TAXED, 3600, TaxMode.STRIPE, ["amount_total 3600 != amount_subtotal 3600 + tax 288"]),
    (TAXED, 3889, TaxMode.STRIPE, ["amount_total 3889 != amount_subtotal 3600 + tax 288"]),
    (replace(TAXED, amount_subtotal=3599), 3887, TaxMode.STRIPE, ["amount_subtotal 3599 != order total 3600"]),
    # A calculation that failed, or never had the address, is never payment of another amount.
    (replace(TAXED, status="failed"), 3888, TaxMode.STRIPE, ["automatic_tax.status is 'failed'"]),
    (
        replace(TAXED, status="requires_location_inputs", amount_tax=0),
        3600,
        TaxMode.STRIPE,
        ["automatic_tax.status is 'requires_location_inputs'"],
    ),
    (NO_TAX, 3600, TaxMode.STRIPE, ["did not calculate tax", "automatic_tax.status is None"]),
    (
        NO_TAX_REPORTED,
        3600,
        TaxMode.STRIPE,
        ["did not calculate", "status is None", "subtotal None", "amount_tax is None"],
    ),
]


@pytest.mark.parametrize("tax,amount,mode,problems", TAXED_PROOFS)
def test_payment_proof_takes_tax_only_when_the_shop_charges_it_and_then_exactly_subtotal_plus_tax(
    tax, amount, mode, problems
):
    verdict = check_payment_proof(
        order_total=3600,
        order_currency="usd",
        amount_total=amount,
        currency="usd",
        payment_status="paid",
        tax=tax,
        tax_mode=mode,
    )
    assert verdict.accepted is (not problems)
    assert len(verdict.problems) == len(problems), verdict.problems
    for fragment, problem in zip(problems, verdict.problems, strict=True):
        assert fragment in problem


def test_a_stripe_tax_session_that_was_not_paid_is_refused_for_that_too():
    verdict = check_payment_proof(
        order_total=3600,
        order_currency="usd",
        amount_total=3888,
        currency="usd",
        payment_status="unpaid",
        tax=TAXED,
        tax_mode=TaxMode.STRIPE,
    )
    assert not verdict.accepted
    assert verdict.problems == ("payment_status is 'unpaid', not 'paid'",)


@pytest.mark.parametrize(
    "tax, amount, mode, said",
    [
        (TAXED, 3888, TaxMode.NONE, "the session calculated tax, which this shop does not charge (TAX_MODE=none)"),
        (NO_TAX, 3600, TaxMode.STRIPE, "the session did not calculate tax (TAX_MODE=stripe)"),
    ],
)
def test_a_tax_mismatch_names_the_setting_as_the_operator_writes_it(tax, amount, mode, said):
    verdict = check_payment_proof(
        order_total=3600,
        order_currency="usd",
        amount_total=amount,
        currency="usd",
        payment_status="paid",
        tax=tax,
        tax_mode=mode,
    )
    assert said in verdict.problems


def test_the_tax_an_accepted_payment_carries_is_zero_without_tax_and_the_sessions_with_stripe_tax():
    assert charged_tax(TaxMode.NONE, TAXED) == 0
    assert charged_tax(TaxMode.STRIPE, TAXED) == 288


def test_a_stripe_tax_session_that_reports_no_tax_amount_carries_zero_tax():
    assert charged_tax(TaxMode.STRIPE, SessionTax(enabled=True, status="complete", amount_subtotal=2400)) == 0


# -- deadlines -----------------------------------------------------------------------------------

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "now,due",
    [
        (T0 + timedelta(seconds=1799), False),
        (T0 + timedelta(seconds=1800), True),
        (T0 + timedelta(seconds=1801), True),
        (T0 - timedelta(seconds=5), False),
    ],
)
def test_an_unpaid_order_is_due_exactly_at_the_end_of_its_window(now, due):
    assert (now >= unpaid_deadline(T0, 1800)) is due  # the deadline's own test (orders.cancel)
    assert unpaid_deadline(T0, 1800) == T0 + timedelta(seconds=1800)


def test_an_order_without_a_payment_session_is_held_for_the_short_hold_and_never_longer_than_the_window():
    assert unpaid_hold_seconds(OrderStatus.PENDING_PAYMENT, 1800, 600) == 600
    assert unpaid_hold_seconds(OrderStatus.PAYMENT_FAILED, 1800, 600) == 1800  # a failed payment: a fresh window
    assert unpaid_hold_seconds(OrderStatus.PENDING_PAYMENT, 300, 600) == 300  # a configuration built around the check


def test_a_session_made_for_an_order_that_had_none_gets_the_whole_window_from_its_creation():
    placed, now = T0, T0 + timedelta(seconds=590)  # "Pay now" ten seconds before the hold ends
    assert session_pay_by(OrderStatus.PENDING_PAYMENT, placed, now, 1800) == now + timedelta(seconds=1800)
    # After a failed payment: the window the failure opened, not a new one per attempt.
    assert session_pay_by(OrderStatus.PAYMENT_FAILED, placed, now, 1800) == placed + timedelta(seconds=1800)


def test_naive_database_datetimes_are_read_as_utc():
    naive = T0.replace(tzinfo=None)
    assert unpaid_deadline(naive, 60) == T0 + timedelta(seconds=60)
    other_zone = T0.astimezone(timezone(timedelta(hours=5)))
    assert as_utc(other_zone) == T0 and as_utc(other_zone).utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "pay_by_offset,min_seconds,expected_offset",
    [
        (1800, 1800, 1800 + SLACK),  # pay-by exactly at the provider's minimum: the minimum plus slack
        (3600, 1800, 3600),  # a long window: the session lives until pay-by
        (600, 1800, 1800 + SLACK),  # a short remaining window: never shorter than the provider allows
        (-30, 60, 60 + SLACK),  # already past pay-by: still the minimum
        (90, 0, 90),
    ],
)
def test_a_session_expires_at_pay_by_but_never_before_the_providers_minimum(
    pay_by_offset, min_seconds, expected_offset
):
    expires = session_expires_at(T0 + timedelta(seconds=pay_by_offset), T0, min_seconds)
    assert expires == T0 + timedelta(seconds=expected_offset)


@pytest.mark.parametrize(
    "attempts,rng,expected",
    [
        (1, 0.0, 1.0),
        (1, 1.0, 2.0),
        (2, 0.0, 2.0),
        (3, 0.0, 4.0),
        (4, 0.5, 12.0),
        (0, 0.0, 1.0),  # before the first attempt: the base delay
        (20, 0.0, 150.0),  # capped at 300 s, then jittered
        (10_000, 0.999, 299.85),  # a huge count neither overflows nor passes the cap
    ],
)
def test_retry_delay_doubles_per_attempt_is_capped_and_jittered_into_the_upper_half(attempts, rng, expected):
    assert retry_delay_seconds(attempts, base=2.0, cap=300.0, rng=lambda: rng) == pytest.approx(expected)


def test_retry_delay_defaults_to_a_two_second_base_and_a_five_minute_cap():
    assert retry_delay_seconds(1, rng=lambda: 1.0) == 2.0
    assert retry_delay_seconds(50, rng=lambda: 1.0) == 300.0


def test_retry_delay_stops_doubling_after_thirty_doublings_whatever_the_cap():
    # The exponent's own bound keeps 2**n a float can hold however many attempts a row has.
    assert retry_delay_seconds(10_000, base=1.0, cap=1e12, rng=lambda: 1.0) == 2.0**30


# -- why an order was cancelled ------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason,who",
    [
        (CANCELLED_BY_CUSTOMER, CancelledBy.CUSTOMER),
        (CANCELLED_BY_CUSTOMER + " (operator's note)", CancelledBy.CUSTOMER),
        (PAYMENT_WINDOW_EXPIRED, CancelledBy.EXPIRED),
        (PAYMENT_WINDOW_EXPIRED + ": no session", CancelledBy.EXPIRED),
        ("operator cancelled it", CancelledBy.OTHER),
        ("", CancelledBy.OTHER),
    ],
)
def test_cancelled_because_tells_the_customer_apart_from_the_payment_window(reason, who):
    assert cancelled_because(reason) is who


def test_the_markers_refusals_say_why_in_the_words_an_operator_reads():
    assert order_in(S.PAID).mark_inventory_restored() == Refused(
        "order_not_cancelled", "only a cancelled order's stock can be restored", {"status": "Paid"}
    )
    order = order_in(S.CANCELLED)
    assert order.mark_inventory_restored() == Ok(())
    assert order.mark_inventory_restored() == Refused(
        "inventory_already_restored", "this order's stock was already restored"
    )


def test_a_refused_transition_names_it_in_words_and_the_state_it_found():
    refused = order_in(S.CANCELLED).mark_paid("cs", 1, "usd")
    assert refused == Refused(
        "order_already_cancelled",
        "cannot mark paid an order that is Cancelled",
        {"transition": "mark_paid", "status": "Cancelled"},
    )


@pytest.fixture
def local_time_not_utc(monkeypatch):
    """The process's local zone set to one that is not UTC (and back), so that a naive or aware
    time read as local time instead of UTC shows."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_as_utc_reads_a_naive_time_as_utc_whatever_the_local_zone(local_time_not_utc):
    naive = datetime(2026, 11, 30, 12, 0)
    assert as_utc(naive) == datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    assert as_utc(naive).tzinfo is timezone.utc


def test_as_utc_turns_an_aware_time_into_utc_whatever_the_local_zone(local_time_not_utc):
    aware = datetime(2026, 11, 30, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert (as_utc(aware), as_utc(aware).utcoffset()) == (T0, timedelta(0))


WHEN = datetime(2026, 12, 5, 16, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("state", ALL_STATES)
def test_only_a_paid_order_ships_and_only_once(state):
    order = order_in(state)
    result = order.ship("1Z999", WHEN)
    if state is not S.PAID:
        assert isinstance(result, Refused) and order.shipped_at is None
        return
    assert result == Ok((OrderShipped(7, "1Z999"),))
    assert (order.status, order.shipped_at, order.tracking) == (S.PAID, WHEN, "1Z999")
    again = order.ship("OTHER", WHEN + timedelta(hours=1))
    assert isinstance(again, Refused) and again.code == "order_already_shipped"
    assert (order.shipped_at, order.tracking) == (WHEN, "1Z999")


def test_a_shipped_event_survives_the_outbox_round_trip():
    event = OrderShipped(7, None)
    assert event_from_payload(event.name, event.payload()) == event
