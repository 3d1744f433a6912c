"""The sweep tells an order it did not ask about because the provider's rate budget was spent
(the shop's guard refused the call, or the provider answered 429) from one the provider did not
answer: counted `held_back`, not `unavailable`, warned about in those words, shown so on
/console/sweeps, and asked about again next cycle (docs/REFERENCE.md, Reconciliation)."""

from __future__ import annotations

import logging
from datetime import timedelta

from factories import seed_catalog_rows
from payment_helpers import awaiting_provider
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import Order
from shop.provider import guard
from shop.scheduling.sweep import run_cycle
from support import log_in

JSON = {"Accept": "application/json"}


def _shop_on_a_clock_that_stands_still(make_fresh_app, sandbox, fake_clock, **config):
    """Provider calls that do not wait for the rate budget, whose tokens never come back unless
    the test moves its clock."""
    return make_fresh_app(
        STRIPE_API_BASE=sandbox.base_url,
        STRIPE_BACKGROUND_WAIT_SECONDS=0.0,
        STRIPE_CUSTOMER_WAIT_SECONDS=0.0,
        CLOCK=fake_clock,
        **config,
    )


def _spend_the_rate_budget() -> None:
    """Take every token, the customers' reserve too; the test's clock stands still, so none comes back."""
    provider_guard = guard.get()
    with guard.customer_call():
        for _ in range(10_000):
            try:
                provider_guard.take_token()
            except guard.Shed:
                return
    raise AssertionError("the rate budget never ran out")


def _sessions_read(sandbox) -> int:
    return sum(
        r["count"]
        for r in sandbox.get("/_sandbox/requests")["data"]
        if r["method"] == "GET" and r["path"].startswith("/v1/checkout/sessions/")
    )


def test_orders_the_sweep_could_not_ask_about_for_a_spent_rate_budget_are_held_back_not_unreachable(
    make_fresh_app, sandbox, fake_clock, caplog
):
    app = _shop_on_a_clock_that_stands_still(make_fresh_app, sandbox, fake_clock, STRIPE_SESSION_MIN_SECONDS=60)
    seed_catalog_rows(app)
    client = app.test_client()
    log_in(app, client)
    stuck_by = utcnow() + timedelta(seconds=app.config["RECONCILIATION_STUCK_AGE_SECONDS"] + 60)
    with app.app_context():
        orders = [awaiting_provider() for _ in range(2)]
        for _, session_id in orders:
            sandbox.set_outcome(session_id, "paid")
        _spend_the_rate_budget()
        asked_before = _sessions_read(sandbox)

        with caplog.at_level(logging.INFO, logger="shop.sweep"):
            held = run_cycle(now=stuck_by)

        assert (held.provider["held_back"], held.provider["unavailable"]) == (2, 0), held.provider
        assert _sessions_read(sandbox) == asked_before  # nothing went out
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("2 order(s) not asked about: the provider's rate budget was spent" in w for w in warnings), warnings
        assert not any("unreachable" in r.getMessage() for r in caplog.records), caplog.text
        assert "2 not asked (the provider's rate budget was spent)" in "\n".join(held.report_lines())
        db.session.remove()

    cycle = client.get("/console/sweeps", headers=JSON).get_json()["cycles"][0]
    assert cycle["provider_counts"]["held_back"] == 2 and cycle["provider_counts"]["unavailable"] == 0, cycle
    page = client.get("/console/sweeps").get_data(as_text=True)
    assert "not asked (the provider&#39;s rate budget was spent)" in page

    fake_clock.advance(5)  # the budget fills again
    with app.app_context():
        again = run_cycle(now=stuck_by)
        assert again.provider["paid"] == 2, again.provider
        assert {db.session.get(Order, order_id).status for order_id, _ in orders} == {"Paid"}
        db.session.remove()


def test_a_scan_for_unknown_money_the_spent_rate_budget_held_back_is_counted_held_back(
    make_fresh_app, sandbox, fake_clock
):
    app = _shop_on_a_clock_that_stands_still(make_fresh_app, sandbox, fake_clock)
    with app.app_context():
        run_cycle(now=utcnow())  # the first cycle of a database only marks where the scan starts
        _spend_the_rate_budget()
        held = run_cycle(now=utcnow() + timedelta(hours=1))  # an hour of the provider's payments to list
        assert (held.provider["held_back"], held.provider["unavailable"]) == (1, 0), held.provider
        db.session.remove()
