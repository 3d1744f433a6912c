"""The Sweeps page in words: a sweep error names the order by its reference with
a link and says what happened and what the sweep does next; the same error collapses with a count,
within a cycle and across cycles; a cycle with errors is not shown as plain "ok". HTML and JSON.

The errors come from real cycles (the Stripe sandbox refusing a session it forgot) and, for rows
recorded before the reference and the kind were, from rows in the old shape."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from factories import force_order, place_order_for, seed_catalog_rows
from shop.domain.deadlines import utcnow
from shop.extensions import db
from shop.models import ReconciliationCycle
from shop.payments.start import start_payment
from shop.scheduling.sweep import run_cycle
from support import log_in

JSON = {"Accept": "application/json"}


@pytest.fixture
def sweep_app(make_fresh_app, sandbox):
    app = make_fresh_app(STRIPE_API_BASE=sandbox.base_url, STRIPE_SESSION_MIN_SECONDS=60)
    seed_catalog_rows(app)
    return app


def later(app, minutes: int = 1):
    return utcnow() + timedelta(seconds=app.config["RECONCILIATION_STUCK_AGE_SECONDS"] + 60 * minutes)


def forgotten_session_order(sandbox) -> tuple[int, str]:
    """A PaymentInitiated order whose session the provider no longer knows: asking about it is
    refused (404) every time, so every provider pass records the same error."""
    placed = place_order_for()
    order_id, reference = placed.order_id, placed.reference
    assert start_payment(order_id).status == "started"
    sandbox.reset()
    return order_id, reference


def test_a_sweep_error_names_the_order_by_reference_with_a_link_and_says_what_next(sweep_app, fresh_client, sandbox):
    with sweep_app.app_context():
        order_id, reference = forgotten_session_order(sandbox)
        result = run_cycle(now=later(sweep_app))
        assert result.status == "ok" and result.provider["errors"] == 1
    log_in(sweep_app, fresh_client)

    cycle = fresh_client.get("/console/sweeps", headers=JSON).get_json()["cycles"][0]
    assert cycle["errors"][0]["order_id"] == order_id  # the recorded shape keeps its old keys
    assert cycle["errors"][0]["reference"] == reference and cycle["errors"][0]["kind"] == "provider_refused"
    [problem] = cycle["problems"]
    assert problem["order_reference"] == reference and problem["order_url"] == f"/console/orders/{reference}"
    assert problem["kind"] == "provider_refused" and "refused" in problem["what"]
    assert "{" not in problem["what"] and "ProviderRefused" not in problem["what"]
    assert problem["next"].startswith("The sweep retries at the next cycle")

    html = fresh_client.get("/console/sweeps").get_data(as_text=True)
    assert f'<a href="/console/orders/{reference}"><strong>{reference}</strong></a>' in html
    assert "'order_id'" not in html and "{&#39;pass&#39;" not in html  # no raw dict any more
    assert "Next: The sweep retries at the next cycle" in html


def test_the_dashboard_json_names_the_order_of_a_sweep_error_by_reference(sweep_app, fresh_client, sandbox):
    with sweep_app.app_context():
        _, reference = forgotten_session_order(sandbox)
        assert run_cycle(now=later(sweep_app)).provider["errors"] == 1
    log_in(sweep_app, fresh_client)

    data = fresh_client.get("/console/", headers=JSON).get_json()
    [problem] = data["last_sweep"]["problems"]
    assert problem["order_reference"] == reference and problem["order_url"] == f"/console/orders/{reference}"
    sweep = next(c for c in data["cards"] if c["key"] == "sweep")
    assert sweep["ok"] is False and sweep["count"] == 1 and reference in sweep["words"]
    assert "{" not in sweep["words"] and "order_id" not in sweep["words"]
    html = fresh_client.get("/console/", headers={"Accept": "text/html"}).get_data(as_text=True)
    card = re.search(r'<section[^>]*data-card="sweep".*?</section>', html, re.S).group(0)
    assert reference in card and "ok with 1 problem" in card


def test_a_cycle_with_errors_is_not_shown_as_plain_ok(sweep_app, fresh_client, sandbox):
    with sweep_app.app_context():
        forgotten_session_order(sandbox)
        run_cycle(now=later(sweep_app))
    log_in(sweep_app, fresh_client)

    cycle = fresh_client.get("/console/sweeps", headers=JSON).get_json()["cycles"][0]
    assert cycle["status"] == "ok"  # the recorded status is unchanged for old readers
    assert cycle["outcome"] == "ok_with_problems" and cycle["outcome_words"] == "ok with 1 problem"
    html = fresh_client.get("/console/sweeps").get_data(as_text=True)
    assert '<span class="badge problems">ok with 1 problem</span>' in html
    assert '<span class="badge ok">ok</span>' not in html


def test_the_same_error_every_cycle_is_shown_once_with_how_many_cycles(sweep_app, fresh_client, sandbox):
    with sweep_app.app_context():
        _, reference = forgotten_session_order(sandbox)
        for minutes in (1, 2, 3):
            assert run_cycle(now=later(sweep_app, minutes)).provider["errors"] == 1
    log_in(sweep_app, fresh_client)

    cycles = fresh_client.get("/console/sweeps", headers=JSON).get_json()["cycles"]
    assert [c["problems"][0]["cycles"] for c in cycles] == [3, 2, 1]
    assert [c["problems"][0]["repeats_newer"] for c in cycles] == [False, True, True]
    html = fresh_client.get("/console/sweeps").get_data(as_text=True)
    assert "The same for the last 3 cycles." in html
    assert html.count(f'<a href="/console/orders/{reference}">') == 1
    assert html.count("the same as the newer cycle above") == 2


def test_old_rows_render_in_words_and_identical_errors_collapse_with_a_count(sweep_app, fresh_client):
    """Rows recorded before the reference and the kind: the order is found by its id, the kind by
    the exception's name; the sweep's own back-off time is what it does next."""
    now = utcnow()
    with sweep_app.app_context():
        placed = place_order_for()
        order_id, reference = placed.order_id, placed.reference
        force_order(order_id, status="PaymentInitiated", provider_next_check_at=now + timedelta(minutes=10, seconds=30))
        old = {"pass": "provider", "order_id": order_id, "error": "ProviderRefused: No such checkout session"}
        db.session.add(
            ReconciliationCycle(
                started_at=now - timedelta(minutes=1),
                finished_at=now,
                cutoff=now,
                status="ok",
                provider_counts={"errors": 2},
                errors=[old, dict(old)],
            )
        )
        db.session.add(
            ReconciliationCycle(
                started_at=now - timedelta(minutes=20), cutoff=now, status="failed", errors=["provider unreachable"]
            )
        )
        db.session.commit()
    log_in(sweep_app, fresh_client)

    cycles = fresh_client.get("/console/sweeps", headers=JSON).get_json()["cycles"]
    [problem] = cycles[0]["problems"]
    assert problem["count"] == 2 and problem["order_reference"] == reference
    assert problem["kind"] == "provider_refused" and "No such checkout session" in problem["what"]
    # The time of day, with the date before it when that is tomorrow (a run just before midnight).
    assert re.search(r"asks again at (\d{4}-\d\d-\d\d )?\d\d:\d\d UTC \(in 10 min\)", problem["next"]), problem["next"]
    assert cycles[0]["outcome_words"] == "ok with 2 problems"
    assert cycles[1]["outcome"] == "failed" and "provider unreachable" in cycles[1]["problems"][0]["what"]

    html = fresh_client.get("/console/sweeps").get_data(as_text=True)
    assert f'<a href="/console/orders/{reference}">' in html and "2 times" in html
    assert html.count("No such checkout session") == 1


@pytest.mark.parametrize(
    ("when", "said"),
    [
        (datetime(2026, 12, 6, 23, 59, tzinfo=timezone.utc), "23:59 UTC (in 9 min)"),
        (datetime(2026, 12, 7, 0, 5, tzinfo=timezone.utc), "2026-12-07 00:05 UTC (in 15 min)"),
    ],
)
def test_a_time_the_sweep_names_carries_its_date_only_when_that_is_not_today(when, said):
    from shop.console.sweep_words import _at

    assert _at(when, datetime(2026, 12, 6, 23, 50, tzinfo=timezone.utc)) == said
