"""The pure retry arithmetic, without Flask or a database: what a failed attempt at durable work
leads to (by why it failed), and when the sweep asks the provider again about an answer that
may change at any moment."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from shop.domain.deadlines import (
    FAILURE_ERROR,
    FAILURE_PROVIDER,
    FAILURE_REFUSED,
    RetryDecision,
    next_provider_check,
    retry_decision,
)

POLICY = dict(base=2.0, cap=300.0, provider_base=2.0, provider_cap=300.0)
TOP = lambda: 0.999  # noqa: E731  (the jitter at its largest)
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def decide(kind, attempts, provider_waits=0, max_attempts=5, rng=TOP, **policy):
    return retry_decision(kind, attempts, max_attempts, provider_waits, **{**POLICY, **policy}, rng=rng)


def test_an_unavailable_provider_never_dead_letters_however_long_it_lasts():
    # A week of failures in a row, on a row that had already used its whole budget.
    for waits in (0, 1, 5, 50, 10_000):
        decision = decide(FAILURE_PROVIDER, attempts=5, provider_waits=waits)
        assert not decision.dead and not decision.spends_attempt


@pytest.mark.parametrize(
    "waits, expected",
    [
        (0, 2.0 * 0.9995),  # the first wait is the base
        (1, 4.0 * 0.9995),  # then it doubles
        (6, 128.0 * 0.9995),
        (7, 256.0 * 0.9995),
        (8, 300.0 * 0.9995),  # and stops at the cap
        (10_000, 300.0 * 0.9995),
    ],
)
def test_waiting_for_the_provider_backs_off_exponentially_up_to_its_own_cap(waits, expected):
    assert decide(FAILURE_PROVIDER, attempts=1, provider_waits=waits).delay_seconds == pytest.approx(expected)


def test_the_wait_for_the_provider_is_jittered_into_the_upper_half_and_follows_its_own_settings():
    low = decide(FAILURE_PROVIDER, 1, provider_waits=20, rng=lambda: 0.0, provider_cap=30.0)
    high = decide(FAILURE_PROVIDER, 1, provider_waits=20, rng=TOP, provider_cap=30.0)
    assert low.delay_seconds == pytest.approx(15.0) and high.delay_seconds == pytest.approx(29.985)


def test_a_refusal_is_dead_at_once_even_with_attempts_left():
    assert decide(FAILURE_REFUSED, attempts=1).dead


def test_an_ordinary_error_spends_the_budget_and_is_dead_at_the_last_attempt():
    for attempt in (1, 2, 3, 4):
        decision = decide(FAILURE_ERROR, attempts=attempt)
        assert not decision.dead and decision.spends_attempt
        assert decision.delay_seconds == pytest.approx(min(300.0, 2.0 * 2 ** (attempt - 1)) * 0.9995)
    assert decide(FAILURE_ERROR, attempts=5).dead
    # Earlier waits for the provider do not change an error's budget or its backoff.
    assert decide(FAILURE_ERROR, attempts=5, provider_waits=40).dead


# -- when the sweep asks again ----------------------------------------------------------------

INTERVAL, CAP = 600, 1800


def check_after(waited_seconds: float) -> float:
    """Seconds from now to the next check, after waiting `waited_seconds` since the anchor."""
    now = T0 + timedelta(seconds=waited_seconds)
    return (next_provider_check(now, T0, INTERVAL, CAP) - now).total_seconds()


def test_the_first_checks_come_one_sweep_interval_apart():
    # Due half an interval early, so the very next cycle (one interval later) takes it.
    assert check_after(0) == 300 and check_after(450) == 300 and check_after(600) == 300


def test_the_checks_then_spread_out_with_the_time_already_waited():
    assert check_after(1200) == 1200 - 300
    assert check_after(1500) == 1500 - 300


def test_the_spacing_never_exceeds_the_cap():
    for waited in (1800, 3600, 86_400, 30 * 86_400):
        assert check_after(waited) == CAP - INTERVAL / 2


def test_a_schedule_run_by_a_sweep_every_interval_doubles_its_spacing_up_to_the_cap():
    """Simulate the sweep: a cycle every interval asks about the order when it is due."""
    due, asked = T0, []
    for cycle in range(1, 30):
        now = T0 + timedelta(seconds=cycle * INTERVAL + 5)  # the check runs a few seconds into its cycle
        if now >= due:
            asked.append(cycle)
            due = next_provider_check(now, T0, INTERVAL, CAP)
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
    assert gaps[:3] == [1, 2, 3] and set(gaps[3:]) == {3}  # never more than the cap's 3 cycles apart


def test_a_cap_below_one_interval_still_waits_one_interval():
    now = T0 + timedelta(hours=5)
    assert next_provider_check(now, T0, 600, 60) == now + timedelta(seconds=300)


def test_an_anchor_in_the_future_counts_as_no_wait_and_naive_times_are_utc():
    now = T0.replace(tzinfo=None)
    assert next_provider_check(now, T0 + timedelta(hours=1), INTERVAL, CAP) == T0 + timedelta(seconds=300)


def test_the_decisions_are_whole_values_with_plain_booleans():
    # What the runner reads (dead, spends_attempt) is a bool, never a falsy stand-in.
    assert decide(FAILURE_PROVIDER, attempts=5) == RetryDecision(
        dead=False, delay_seconds=2.0 * 0.9995, spends_attempt=False
    )
    assert decide(FAILURE_ERROR, attempts=1) == RetryDecision(
        dead=False, delay_seconds=2.0 * 0.9995, spends_attempt=True
    )
    assert decide(FAILURE_ERROR, attempts=5) == RetryDecision(dead=True)
    assert decide(FAILURE_REFUSED, attempts=1) == RetryDecision(dead=True)


def test_a_sub_second_interval_is_checked_again_after_half_of_it_when_nothing_was_waited():
    # Nothing waited yet (or a `since` a clock put ahead of now): one interval, due half of it early.
    assert next_provider_check(T0, T0, 0.5, 10) == T0 + timedelta(seconds=0.25)
    assert next_provider_check(T0, T0 + timedelta(seconds=5), 0.5, 10) == T0 + timedelta(seconds=0.25)
