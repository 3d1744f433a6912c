"""A model-based test of the order saga: hypothesis drives the real use cases on the
real database, Redis and the Stripe sandbox through random interleavings, with one injected
clock, and a reference model says what stock and money must be after every step.

CI runs a fixed, derandomized set of interleavings, plus fixed journeys (below) through the
endings the random set may not reach in 40 examples: an async payment that succeeds or fails, late
money after a cancel (its webhook delivered twice, or lost so only the sweep finds it), and a
reordered webhook. The long profile (random, at least 1,000):

    BACKSTOP_MODEL_EXAMPLES=1000 DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \
        .venv/bin/python -m pytest -q tests/saga/test_saga_model.py

The world (see tests/saga_model_support.py): three variants with small stock; customers place
carts (some larger than the stock), start payments, pay, get declined, pay asynchronously, let
their page expire or have it expired early, come back to the return page and cancel with the
version they saw or a stale one. The sandbox's events are collected and delivered by the test,
signed, to the webhook route: out of order, twice, late or never. Deadlines fire early, on time,
late, twice or concurrently; the sweep runs; deliveries run one by one, in drains, twice at
once, fail mid-transaction (the compensation's failpoint) or are claimed by a worker that dies;
Redis loses everything and the relay runs; the operator retries, discards and reconciles.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from factories import seed_catalog_rows
from saga_model_support import SagaModel, World, install_clock
from shop.outbox.runner import RunOutcome
from shop.provider import guard

LONG_EXAMPLES = int(os.environ.get("BACKSTOP_MODEL_EXAMPLES", "0") or 0)

# No shrinking: a step's outcome depends on real time passing (the clock runs between steps) and
# on races, so a shrunk replay may not fail the same way; the failing interleaving is printed
# whole instead, with every step's arguments.
COMMON = dict(
    derandomize=False,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
CI = settings(**{**COMMON, "derandomize": True}, max_examples=40, stateful_step_count=30)
LONG = settings(**COMMON, max_examples=LONG_EXAMPLES or 1, stateful_step_count=40)


@pytest.fixture
def world(make_fresh_app, sandbox, redis_conn, is_postgres, monkeypatch, tmp_path) -> World:
    app = make_fresh_app(**World.CONFIG, STRIPE_API_BASE=sandbox.base_url)
    # Its emails (thousands of order-1-... files) go to a folder of its own, not instance/mail,
    # where tests that run after it look for the mail of their own order 1.
    app.instance_path = str(tmp_path)
    seed_catalog_rows(app)
    install_clock(monkeypatch, sandbox)
    return World(app, sandbox, redis_conn, is_postgres)


def test_random_interleavings_keep_stock_and_money_right(world):
    machine = type("Saga", (SagaModel,), {"world": world})
    run_state_machine_as_test(machine, settings=LONG if LONG_EXAMPLES else CI)
    print(f"\nsaga model: {world.examples} interleavings, {world.steps} steps, {dict(sorted(world.counts.items()))}")


# -- fixed journeys ----------------------------------------------------------------------------
#
# Hypothesis has no @example for a state machine, so each journey drives the same machine by
# hand: its own rules, in a fixed order, with every @invariant checked after every step (as
# hypothesis does) and its teardown at the end (time runs past every window, deadlines, sweeps
# and drains run, then the drained and settled checks: stock conserved, every cancelled order
# restored once, every paid session its order's payment or refunded exactly once). Each journey
# also asserts the ending it pins, so a journey that silently took another path fails.

ASYNC_DONE = "checkout.session.completed"
SUCCEEDED = "checkout.session.async_payment_succeeded"
FAILED = "checkout.session.async_payment_failed"


class Journey:
    """One SagaModel driven step by step: `journey("rule", **arguments)`."""

    def __init__(self, world: World):
        self.machine = type("Saga", (SagaModel,), {"world": world})()
        assert self.machine.invariants, "the machine has no invariants to check"
        # One checkout of one notebook, its payment started: the order every journey follows.
        self("reset", stock=(3, 3, 2), carts=[[(0, 1)]])
        (self.order_id,) = self.machine.orders

    def __call__(self, rule: str, **arguments) -> None:
        getattr(self.machine, rule)(**arguments)
        for invariant in self.machine.invariants:
            invariant.function(self.machine)

    def _index(self, event_type: str) -> int:
        found = [i for i, (_, kind, _) in enumerate(self.machine.pool) if kind == event_type]
        assert found, f"no {event_type} waiting; the pool holds {[kind for _, kind, _ in self.machine.pool]}"
        return found[0]

    def deliver(self, event_type: str, *, again: bool = False) -> str:
        """The oldest waiting event of that type reaches the webhook (kept for another delivery
        when `again`); returns the webhook's outcome."""
        self("webhook_delivered", pick=self._index(event_type), again=again)
        return self.machine.last_webhook

    def lose(self, event_type: str) -> None:
        self("webhook_lost", pick=self._index(event_type))

    def order(self) -> dict:
        return self.machine.shop()["orders"][self.order_id]

    def refunds(self) -> tuple[list[dict], list[dict]]:
        """(the shop's refund rows, the provider's refunds)."""
        return self.machine.shop()["refunds"], self.machine.provider()["refunds"]

    def settle(self) -> None:
        """The end of every run: the machine's teardown (settle, then the drained and settled checks)."""
        self.machine.teardown()
        for invariant in self.machine.invariants:
            invariant.function(self.machine)

    def provider_rate_limits(self, seconds: float) -> None:
        """The provider answered 429 with `Retry-After: seconds`: the guard holds every call to it
        until then, on the rate budget's own clock (Redis's)."""
        with self.machine.ctx():
            guard.get().pause(seconds)

    def pending_async(self) -> None:
        """The customer pays with a method that settles later; the completed-but-unpaid notice
        leaves the order waiting for the money."""
        self("the_provider", pick=0, what="async_pending")
        assert self.deliver(ASYNC_DONE) == "awaiting_async"
        assert self.order()["status"] == "PaymentInitiated"


def journey_async_pending_then_succeeded(j: Journey) -> None:
    """Pins: an async payment that succeeds pays the order, minutes after the customer left."""
    j.pending_async()
    j("time_passes", how="minute", pick=0)
    j("the_provider", pick=0, what="async_succeeded")
    assert j.deliver(SUCCEEDED) == "paid"
    j("background", what="drain")
    j.settle()
    assert j.order()["status"] == "Paid"
    assert j.refunds() == ([], [])


def journey_async_pending_then_failed(j: Journey) -> None:
    """Pins: an async payment that fails leaves the order unpaid with a fresh window; nobody pays,
    so its deadline cancels it and its stock comes back, and no money moves."""
    j.pending_async()
    j("the_provider", pick=0, what="async_failed")
    assert j.deliver(FAILED) == "payment_failed"
    assert j.order()["status"] == "PaymentFailed"
    j("background", what="drain")
    j.settle()
    assert j.order()["status"] == "Cancelled" and j.order()["restored"]
    assert j.refunds() == ([], [])


def _cancel_while_money_is_on_its_way(j: Journey) -> None:
    j.pending_async()
    j("the_customer", pick=0, what="cancel")
    assert j.order()["status"] == "Cancelled"
    j("the_provider", pick=0, what="async_succeeded")  # the money settles after the cancel


def _refunded_exactly_once(j: Journey) -> None:
    shop, provider = j.refunds()
    assert [r["status"] for r in shop] == ["succeeded"], shop
    assert len(provider) == 1 and provider[0]["amount"] == j.machine.orders[j.order_id].total, provider
    order = j.order()
    assert order["status"] == "Cancelled" and order["restored"]


def journey_late_money_after_cancel_duplicated_webhook(j: Journey) -> None:
    """Pins: money that settles after a cancel is refunded exactly once, though its webhook
    arrives twice (the second delivery refunds nothing more)."""
    _cancel_while_money_is_on_its_way(j)
    assert j.deliver(SUCCEEDED, again=True) == "refund_created"
    assert j.deliver(SUCCEEDED) == "duplicate"
    j("background", what="drain")
    _refunded_exactly_once(j)
    j.settle()
    _refunded_exactly_once(j)


def journey_late_money_after_cancel_webhook_lost(j: Journey) -> None:
    """Pins: money that settles after a cancel is refunded exactly once even when its webhook is
    lost: the sweep, which watches a cancelled order whose session could still take money, finds
    it (before the teardown's own sweeps run)."""
    _cancel_while_money_is_on_its_way(j)
    j.lose(SUCCEEDED)
    assert all(kind != SUCCEEDED for _, kind, _ in j.machine.pool)  # nothing left to deliver it
    j("background", what="sweep")
    j("background", what="drain")
    _refunded_exactly_once(j)
    j.settle()
    _refunded_exactly_once(j)


def journey_late_money_after_cancel_every_webhook_lost(j: Journey) -> None:
    """Pins: the cancel itself marks the order for the sweep's watch when its session awaits an
    async payment: with the completed notice lost too, nothing else told the shop money may come,
    and the late money is still found by the sweep and refunded exactly once."""
    j("the_provider", pick=0, what="async_pending")
    j.lose(ASYNC_DONE)
    j("the_customer", pick=0, what="cancel")
    assert j.order()["status"] == "Cancelled"
    j("the_provider", pick=0, what="async_succeeded")
    j.lose(SUCCEEDED)
    j("background", what="sweep")
    j("background", what="drain")
    _refunded_exactly_once(j)
    j.settle()
    _refunded_exactly_once(j)


def journey_reordered_and_duplicated_webhooks(j: Journey) -> None:
    """Pins: the success of an async payment delivered before its completed notice pays the
    order; the completed notice arriving after it, and the success again, change nothing."""
    j("the_provider", pick=0, what="async_pending")
    j("the_provider", pick=0, what="async_succeeded")
    assert j.deliver(SUCCEEDED, again=True) == "paid"
    assert j.deliver(ASYNC_DONE) in ("noop", "duplicate")
    assert j.deliver(SUCCEEDED) == "duplicate"
    assert j.order()["status"] == "Paid"
    j("background", what="drain")
    j.settle()
    assert j.order()["status"] == "Paid"
    assert j.refunds() == ([], [])


def journey_deadline_sent_back_by_the_providers_rate_budget(j: Journey) -> None:
    """Pins: a deadline the provider's rate budget sent back (a 429's Retry-After held every call)
    asks the provider again once the clock has passed that wait, and cancels the order whose
    session expired; no money moves. The settle waits for it on the one clock: moving the clock
    moves the budget's too, or the budget, which counts on Redis's clock, would keep sending the
    deadline back however far the clock went (docs/REFERENCE.md, STRIPE_RATE_LIMIT_PER_SECOND:
    background calls, deadlines among them, are retried later; a 429 holds every call until its
    Retry-After)."""
    j("time_passes", how="past_session_expiry", pick=0)
    j.provider_rate_limits(seconds=120)  # longer than this test runs: only the clock can end it
    j("deadline_fires", pick=0, when="now")
    assert j.machine.last_deadline == RunOutcome.RESCHEDULED
    assert j.order()["status"] == "PaymentInitiated"
    j.settle()
    order = j.order()
    assert order["status"] == "Cancelled" and order["restored"]
    assert j.refunds() == ([], [])


JOURNEYS = [
    journey_async_pending_then_succeeded,
    journey_async_pending_then_failed,
    journey_late_money_after_cancel_duplicated_webhook,
    journey_late_money_after_cancel_webhook_lost,
    journey_late_money_after_cancel_every_webhook_lost,
    journey_reordered_and_duplicated_webhooks,
    journey_deadline_sent_back_by_the_providers_rate_budget,
]


@pytest.mark.parametrize("journey", JOURNEYS, ids=[j.__name__.removeprefix("journey_") for j in JOURNEYS])
def test_fixed_journey(world, journey):
    journey(Journey(world))


def test_the_models_clock_moves_the_provider_budgets_endpoint_windows(make_fresh_app, fake_clock):
    """Pins the budget the CI failure met: an endpoint's background share, spent within a moment
    (as an interleaving spends it: minutes of the model's time run in milliseconds), is free again
    once the shop's clock has passed its window, whatever Redis's own clock says
    (docs/REFERENCE.md, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND: each endpoint's grants are counted
    over the last 1.15 s). The model's clock is such a clock (`SandboxClock.shared_time`)."""
    app = make_fresh_app(STRIPE_RATE_LIMIT_PER_SECOND=10_000, CLOCK=fake_clock)  # only the endpoint can refuse
    endpoint = "GET /v1/checkout/sessions/{id}"
    with app.app_context(), guard.background_call(0.0):
        provider = guard.get()
        granted = 0
        with pytest.raises(guard.Shed, match=re.escape(endpoint)):
            for _ in range(1000):
                provider.take_token(endpoint)
                granted += 1
        assert granted == provider.limits.endpoint_rate_per_second - provider.limits.endpoint_reserve
        fake_clock.advance(1.2)
        assert provider.take_token(endpoint).endpoint == endpoint
