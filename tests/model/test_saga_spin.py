"""spin checks the order saga's model (model/saga.pml) against the shop's guarantees
(docs/REFERENCE.md, Guarantees): every interleaving at the exhaustive sizes (model/README.md), the
liveness properties under weak fairness, random simulations beyond those sizes, and four seeded
bugs, each of which spin must catch. Needs Debian's spin and gcc; skipped, saying which is
missing, without them."""

from __future__ import annotations

import re

import pytest

from model_support import (
    HELD_ACTIONS,
    LARGER,
    LARGER_HELD,
    LIVENESS,
    ONE_ORDER_HELD,
    ONE_ORDER_TWO_SESSIONS,
    TOOLS_MISSING,
    TWO_ORDERS,
    TWO_ORDERS_HELD,
    build,
    model_text,
    seeded,
    simulate,
    verify,
)

pytestmark = pytest.mark.skipif(bool(TOOLS_MISSING), reason=f"needs {' and '.join(TOOLS_MISSING)} on PATH")

# One bug each, as the exact text it replaces (tests/model_support.seeded asserts it is there once).
BUGS = {
    # (a) the compensation gives stock back without reading or writing the once-only marker
    "restore_ignores_marker": (
        "#define MARKER_SET(o) restored[o]\n#define MARK_RESTORED(o) restored[o] = 1; BUMP(o)\n",
        "#define MARKER_SET(o) 0\n#define MARK_RESTORED(o) skip\n",
    ),
    # (b) the customer's cancel leaves the hosted page open (no expire at the provider)
    "cancel_keeps_session_open": (
        "/* SEEDED (b): the retire */\n"
        "                 sess[SI(o, k - 1)] = S_EXPC; notes[SI(o, k - 1)] = notes[SI(o, k - 1)] | W_EXP\n",
        "/* SEEDED (b): not retired */\n                 skip\n",
    ),
    # (c) money for a session is refunded as late money whatever the order's state
    "late_money_without_cancelled_check": (
        "(st[o] == CANCELLED || (st[o] == PAID && psess[o] != k + 1))",
        "(true || (st[o] == PAID && psess[o] != k + 1))",
    ),
    # (d) the store saves an order without WHERE version = <read>: a lost update
    "save_without_version_guard": (
        "#define SAVE_GUARD(o, r) ((stale[o] & r) == 0)",
        "#define SAVE_GUARD(o, r) (true)",
    ),
}


# The held journey's (HOLD=1), caught at one order with a held payment.
HELD_BUGS = {
    # (e) a held order's cancel refunds its hold as late money instead of voiding it
    "cancel_refunds_the_hold": (
        "#define HELD_CANCEL(o) schedule_void(o, psess[o] - 1)",
        "#define HELD_CANCEL(o) late_money(o, psess[o] - 1)",
    ),
    # (f) a ship's note of the capture leaves the order's version: a cancel that read the order
    # before it saves over a hold the capture has just taken
    "ship_keeps_the_version": (
        "#define NOTE_CAPTURE(o) capreq[o] = 1; BUMP(o)",
        "#define NOTE_CAPTURE(o) capreq[o] = 1",
    ),
}
# Seeds whose random runs of the held journey (LARGER_HELD) together take every held step.
HELD_SEEDS = (15, 64, 143, 269, 274)


@pytest.fixture(scope="module")
def liveness_verifier(tmp_path_factory):
    return build(model_text(), ONE_ORDER_TWO_SESSIONS, tmp_path_factory.mktemp("liveness"), liveness=True)


# Built once for the module, as liveness_verifier is: each property and each seeded bug's test
# runs the same verifier, and compiling one takes seconds of CPU.
@pytest.fixture(scope="module")
def held_liveness_verifier(tmp_path_factory):
    return build(model_text(), ONE_ORDER_HELD, tmp_path_factory.mktemp("held-liveness"), liveness=True)


@pytest.fixture(scope="module")
def held_safety_verdict(tmp_path_factory):
    """The unseeded held model's safety search at one order, which each held seeded bug's test
    sets beside its own."""
    return verify(build(model_text(), ONE_ORDER_HELD, tmp_path_factory.mktemp("held-right")))


def test_two_orders_racing_for_one_unit_break_no_safety_guarantee_in_any_interleaving(tmp_path):
    result = verify(build(model_text(), TWO_ORDERS, tmp_path))
    assert result.errors == 0, result.output
    assert result.states > 1_000_000, f"the two-order search is smaller than the model allows:\n{result.output}"


def test_an_order_paying_again_after_a_failed_payment_breaks_no_safety_guarantee(tmp_path):
    result = verify(build(model_text(), ONE_ORDER_TWO_SESSIONS, tmp_path))
    assert result.errors == 0, result.output
    assert result.states > 10_000, result.output


@pytest.mark.parametrize("ltl", LIVENESS)
def test_every_order_settles_under_weak_fairness(liveness_verifier, ltl):
    result = verify(liveness_verifier, ltl)
    assert result.errors == 0, result.output
    assert f"ltl formula {ltl}" in result.output


def test_without_fairness_an_order_can_stay_unsettled_forever(liveness_verifier):
    """The liveness runs above prove something: without weak fairness (a deadline or sweep that
    never runs), pan finds an order that never settles."""
    result = verify(liveness_verifier, "final", fairness=False)
    assert result.errors > 0, result.output
    assert "acceptance cycle" in result.output, result.output


@pytest.mark.parametrize("seed", [1, 7, 42, 1234, 99991])
def test_random_runs_of_three_orders_for_two_units_violate_no_assertion(tmp_path, seed):
    output = simulate(model_text(), LARGER, seed, 4000, tmp_path)
    assert "assertion violated" not in output, output[-3000:]
    checkouts = re.findall(r"^STEP (\d) checkout(?:_refused)?$", output, re.MULTILINE)
    assert sorted(checkouts) == ["0", "1", "2"], output[-3000:]
    assert "Error:" not in output, output[-3000:]


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_spin_catches_the_seeded_bug(tmp_path, bug):
    old, new = BUGS[bug]
    result = verify(build(seeded(old, new), ONE_ORDER_TWO_SESSIONS, tmp_path))
    assert result.errors > 0, f"spin missed the seeded bug {bug}:\n{result.output}"
    assert "assertion violated" in result.output, result.output


def test_two_orders_with_held_payments_racing_for_one_unit_break_no_guarantee_in_any_interleaving(tmp_path):
    """Capture at dispatch: each hold captured at most once, never both captured and voided,
    voided (never refunded) at a cancel, never captured for a cancelled order; a shipped order's
    hold was captured; stock conserved; at quiet every order final and every Paid one shipped."""
    result = verify(build(model_text(), TWO_ORDERS_HELD, tmp_path))
    assert result.errors == 0, result.output
    assert result.states > 1_000_000, f"the held two-order search is smaller than the model allows:\n{result.output}"


@pytest.mark.parametrize("ltl", LIVENESS)
def test_an_order_with_a_held_payment_settles_under_weak_fairness(held_liveness_verifier, ltl):
    result = verify(held_liveness_verifier, ltl)
    assert result.errors == 0, result.output
    assert f"ltl formula {ltl}" in result.output


def test_random_runs_of_held_payments_take_every_held_step_and_violate_no_assertion(tmp_path):
    taken = set()
    for seed in HELD_SEEDS:
        output = simulate(model_text(), LARGER_HELD, seed, 4000, tmp_path / str(seed))
        assert "assertion violated" not in output and "Error:" not in output, output[-3000:]
        taken |= set(re.findall(r"^STEP \d (\w+)", output, re.MULTILINE))
    assert HELD_ACTIONS <= taken, f"no held run takes {sorted(HELD_ACTIONS - taken)}"
    printed = set(re.findall(r'printf\("STEP %d (\w+)', model_text()))
    assert HELD_ACTIONS <= printed, sorted(HELD_ACTIONS - printed)


@pytest.mark.parametrize("bug", sorted(HELD_BUGS))
def test_spin_catches_the_seeded_bug_of_the_held_journey(held_safety_verdict, tmp_path, bug):
    old, new = HELD_BUGS[bug]
    assert held_safety_verdict.errors == 0, held_safety_verdict.output
    result = verify(build(seeded(old, new), ONE_ORDER_HELD, tmp_path / "seeded"))
    assert result.errors > 0, f"spin missed the seeded bug {bug}:\n{result.output}"
    assert "assertion violated" in result.output, result.output
