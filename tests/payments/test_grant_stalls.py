"""A process held up while it takes a grant of the provider rate budget (a pause, a starved core):
the grant comes back too old to be sent (GRANT_FRESH_SECONDS) and goes back. The budget had room,
so the stall is not the budget being spent: the call asks again rather than being refused for a
time it spent standing still, unless its own deadline has passed (docs/ARCHITECTURE.md, Budgets)."""

from __future__ import annotations

import pytest

from shop.provider import guard

ENDPOINT = "GET /v1/checkout/sessions/{id}"


def _stall_on_takes(provider_guard, fake_clock, seconds: float, times: int) -> list[str]:
    """The first `times` budget takes come back `seconds` late on the test's clock, as a process
    descheduled (or paused) between asking Redis and reading its answer; the takes asked, in order."""
    real_run, asked = provider_guard.shared.run, []

    def run(name, source, keys, args):
        reply = real_run(name, source, keys, args)
        if name == "take":
            asked.append(name)
            if len(asked) <= times:
                fake_clock.advance(seconds)
        return reply

    provider_guard.shared.run = run
    return asked


def _window(provider_guard) -> list[str]:
    members = provider_guard.shared.connection().zrange(provider_guard.budget.endpoint_prefix + ENDPOINT, 0, -1)
    return [m.decode() for m in members]


def test_a_background_call_held_up_past_its_patience_while_taking_a_grant_asks_again_instead_of_being_refused(
    make_fresh_app, fake_clock
):
    # The sweep's call: background, 2 s of patience (STRIPE_BACKGROUND_WAIT_SECONDS). Held up for
    # 2.5 s with its grant in hand, it once gave the grant back and was refused "the budget is
    # spent; next call in 0.00 s", and the sweep counted the order's provider as unreachable.
    app = make_fresh_app(CLOCK=fake_clock, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=50)
    with app.app_context():
        provider_guard = guard.get()
        asked = _stall_on_takes(provider_guard, fake_clock, 2.5, times=1)
        grant = provider_guard.take_token(ENDPOINT)
        assert grant.fresh() and len(asked) == 2
        assert _window(provider_guard) == [grant.member]  # the stale grant's place went back


def test_a_process_held_up_on_every_grant_is_refused_after_one_more_ask_saying_so(make_fresh_app, fake_clock):
    app = make_fresh_app(CLOCK=fake_clock, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=50)
    with app.app_context():
        provider_guard = guard.get()
        asked = _stall_on_takes(provider_guard, fake_clock, 2.5, times=10)
        with pytest.raises(guard.Shed, match="held up past each grant of the provider rate budget for background"):
            provider_guard.take_token(ENDPOINT)
        assert len(asked) == 2 and _window(provider_guard) == []  # both grants went back


def test_a_customer_call_held_up_past_its_deadline_is_not_asked_again(make_fresh_app, fake_clock):
    # A customer's request has a deadline (STRIPE_REQUEST_BUDGET_SECONDS): a stall that ran past
    # it ends the call, however much patience the budget would give.
    app = make_fresh_app(CLOCK=fake_clock, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=50, STRIPE_CUSTOMER_WAIT_SECONDS=5.0)
    with app.app_context(), guard.customer_call(budget_seconds=1.0):
        provider_guard = guard.get()
        asked = _stall_on_takes(provider_guard, fake_clock, 2.5, times=1)
        with pytest.raises(guard.Shed):
            provider_guard.take_token(ENDPOINT)
        assert len(asked) == 1 and _window(provider_guard) == []


def test_a_customer_call_held_up_within_its_deadline_asks_again(make_fresh_app, fake_clock):
    # The default customer patience (0.2 s) is shorter than many a stall on a busy machine; the
    # request's deadline is not: the checkout goes on rather than joining the line.
    app = make_fresh_app(CLOCK=fake_clock, STRIPE_ENDPOINT_RATE_LIMIT_PER_SECOND=50, STRIPE_CUSTOMER_WAIT_SECONDS=0.2)
    with app.app_context(), guard.customer_call(budget_seconds=9.0):
        provider_guard = guard.get()
        asked = _stall_on_takes(provider_guard, fake_clock, 0.5, times=1)
        grant = provider_guard.take_token(ENDPOINT)
        assert grant.fresh() and len(asked) == 2 and _window(provider_guard) == [grant.member]
