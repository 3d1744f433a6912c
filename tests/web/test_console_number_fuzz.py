"""Every number an operator types in a console form is ASCII digits within what its column holds
(PostgreSQL's int4: 2147483647), or a refusal in words: never a 500 and never a write
(docs/REFERENCE.md, Console). A property over each form's numeric fields: huge, negative where
no sign is allowed, digits of other scripts, floats, exponents, empty where a value is required.
The stock form's figures are int4 columns, and a delta whose result overflows one is refused too:
only PostgreSQL fails on them, so run this there as well."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from factories import catalog_rows, on_hand, place_order_for
from payment_helpers import place_and_pay
from shop.domain.deadlines import utcnow
from shop.domain.refunds import RefundStatus
from shop.extensions import db
from shop.models import CardAcknowledgement, Order, Refund, StockCorrection
from support import log_in

JSON = {"Accept": "application/json"}
INT4_MAX = 2_147_483_647
ON_HAND = 20
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

_OTHER_DIGITS = st.characters(categories=["Nd", "No"], exclude_characters="0123456789")


def hostile(*, signed: bool = False, empty: bool = False) -> st.SearchStrategy[str]:
    """Text that is no number the field may hold. `signed`: a sign is allowed (a delta), so only
    magnitudes past int4 are hostile; `empty`: the field is required."""
    sign = st.sampled_from(["", "+", "-"] if signed else ["", "+"])
    cases = [
        st.builds(lambda s, n: f"{s}{n}", sign, st.integers(INT4_MAX + 1, 10**40)),
        st.text(_OTHER_DIGITS, min_size=1, max_size=12),
        st.builds(lambda a, b, c: f"{a}{b}{c}", st.sampled_from(["", "1"]), _OTHER_DIGITS, st.sampled_from(["", "2"])),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.builds(lambda m, e: f"{m}e{e}", st.integers(0, 99), st.integers(0, 999_999)),
        st.sampled_from(["1.5", "0x10", "1_000", "12 3", "١٢", "١", "１", "²", "Infinity", "--1", "+-1", "1,000"]),
    ]
    if not signed:
        cases.append(st.integers(max_value=-1).map(str))
    if empty:
        cases.append(st.sampled_from(["", " ", "\t"]))
    return st.one_of(cases)


def _count(app, model) -> int:
    with app.app_context():
        try:
            return db.session.execute(select(func.count()).select_from(model)).scalar_one()
        finally:
            db.session.remove()


def _refused_in_words(r) -> None:
    assert r.status_code < 500, r.get_data(as_text=True)[:500]
    assert 400 <= r.status_code < 500 and r.get_json()["error"], r.get_data(as_text=True)[:500]


@pytest.fixture
def stock_console(fresh_app):
    with fresh_app.app_context():
        (variant,) = catalog_rows(ON_HAND)
        db.session.remove()
    client = fresh_app.test_client()
    return fresh_app, client, log_in(fresh_app, client), variant


# (the field given a hostile value, the rest of the form) for each way the stock form is used.
_STOCK_FORMS = [
    ("count", {"seen": str(ON_HAND), "held": "0"}),
    ("seen", {"count": "5", "held": "0"}),
    ("held", {"count": "5", "seen": str(ON_HAND)}),
    ("on_hand", {"seen": str(ON_HAND)}),
    ("seen", {"on_hand": "5"}),
    ("on_hand", {}),
]


@FUZZ
@given(form=st.sampled_from(_STOCK_FORMS), typed=hostile(empty=True), seen_or_held=hostile())
def test_stock_counts_and_seen_figures_out_of_int4_or_not_ascii_digits_are_refused_in_words(
    stock_console, form, typed, seen_or_held
):
    app, client, token, variant = stock_console
    name, rest = form
    value = seen_or_held if name in ("seen", "held") else typed
    data = {"csrf_token": token, "reason": "shelf count", **rest, name: value}

    _refused_in_words(client.post(f"/console/inventory/{variant}/adjust", data=data, headers=JSON))

    assert on_hand(variant, app) == ON_HAND and _count(app, StockCorrection) == 0


@FUZZ
@given(
    delta=st.one_of(
        hostile(signed=True, empty=True),
        st.integers(INT4_MAX - ON_HAND + 1, INT4_MAX).map(lambda n: f"+{n}"),  # the result overflows
        st.integers(-INT4_MAX, -ON_HAND - 1).map(str),  # the result is negative
    )
)
def test_a_stock_delta_that_is_no_number_or_overflows_the_column_is_refused_in_words(stock_console, delta):
    app, client, token, variant = stock_console
    data = {"csrf_token": token, "reason": "found a box", "delta": delta}

    _refused_in_words(client.post(f"/console/inventory/{variant}/adjust", data=data, headers=JSON))

    assert on_hand(variant, app) == ON_HAND and _count(app, StockCorrection) == 0


@pytest.fixture
def refund_console(make_fresh_app, sandbox):
    app, order_id, _total, _skus = place_and_pay(make_fresh_app, sandbox, "SOCK-M", 2)
    with app.app_context():
        order = db.session.get(Order, order_id)
        assert order is not None
        reference, line_id = order.reference, order.lines[0].id
        db.session.remove()
    client = app.test_client()
    return app, client, log_in(app, client), reference, line_id


@FUZZ
@given(field=st.sampled_from(["amount", "restock"]), typed=hostile())
def test_a_refund_amount_or_units_to_put_back_that_is_no_number_it_holds_is_refused_in_words(
    refund_console, field, typed
):
    app, client, token, reference, line_id = refund_console
    data = {"csrf_token": token, "reason": "damaged", "amount": "100"}
    if field == "amount":
        data["amount"] = typed
    else:
        data[f"restock_{line_id}"] = typed

    _refused_in_words(client.post(f"/console/orders/{reference}/refund", data=data, headers=JSON))

    assert _count(app, Refund) == 0


@pytest.fixture
def ack_console(fresh_paying_app):
    client = fresh_paying_app.test_client()
    return fresh_paying_app, client, log_in(fresh_paying_app, client)


@FUZZ
@given(hours=hostile())
def test_a_card_acknowledgement_for_hours_it_cannot_hold_is_refused_in_words(ack_console, hours):
    app, client, token = ack_console
    data = {"csrf_token": token, "reason": "looking into it", "hours": hours}

    _refused_in_words(client.post("/console/cards/rejected_webhooks/acknowledge", data=data, headers=JSON))

    assert _count(app, CardAcknowledgement) == 0


@pytest.fixture
def failed_refund_console(fresh_app):
    """A failed refund (its first attempt), as the provider's report left it, and an operator."""
    with fresh_app.app_context():
        placed = place_order_for({catalog_rows(5)[0]: 1}, email="late@example.com")
        refund = Refund(
            order_id=placed.order_id,
            session_id="cs_test_fuzz",
            amount=500,
            currency="usd",
            reason="late money",
            status=RefundStatus.FAILED,
            failed_at=utcnow(),
        )
        db.session.add(refund)
        db.session.commit()
        refund_id = refund.id
        db.session.remove()
    client = fresh_app.test_client()
    return fresh_app, client, log_in(fresh_app, client), refund_id


@FUZZ
@given(attempt=hostile())
@example(attempt="١")  # Arabic-Indic 1: int() reads it as the attempt the refund is at
def test_a_refund_retry_for_an_attempt_that_is_no_number_it_holds_is_refused_in_words(failed_refund_console, attempt):
    app, client, token, refund_id = failed_refund_console

    r = client.post(f"/console/refunds/{refund_id}/retry", data={"csrf_token": token, "attempt": attempt}, headers=JSON)

    _refused_in_words(r)
    with app.app_context():
        refund = db.session.get(Refund, refund_id)
        assert refund is not None and refund.status == RefundStatus.FAILED and refund.attempts == 1
        db.session.remove()


@FUZZ
@given(bound=st.sampled_from(["amount", "amount_min", "amount_max"]), typed=hostile(signed=True))
def test_a_console_amount_filter_that_is_no_number_answers_in_words_not_500(stock_console, bound, typed):
    _app, client, _token, _variant = stock_console
    for listing in ("/console/orders", "/console/refunds"):
        r = client.get(listing, query_string={bound: typed}, headers=JSON)
        assert r.status_code in (200, 400), r.get_data(as_text=True)[:500]
