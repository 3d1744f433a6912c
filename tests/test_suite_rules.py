"""Rules of the suite itself: the tests wait on conditions (support.wait_until, poll_until) or
move a fake clock, not on the clock; the few sleeps left are a fault's own length, each saying so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MOST_BARE_SLEEPS = 10


def _is_time_sleep(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "sleep"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def bare_sleeps(tree: ast.AST) -> list[int]:
    """The lines of `time.sleep(...)` calls not inside a `while` or `for` loop's body (a loop's
    pause between two looks is a poll; any other sleep waits on the clock)."""
    found: list[int] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            looped = in_loop or (isinstance(node, (ast.While, ast.For)) and child in node.body)
            if _is_time_sleep(child) and not looped:
                found.append(child.lineno)
            visit(child, looped)

    visit(tree, False)
    return found


def test_bare_sleeps_are_counted_outside_loops_only():
    code = "import time\ntime.sleep(1)\nwhile True:\n    time.sleep(2)\nfor _ in x:\n    if y:\n        time.sleep(3)\n"
    assert bare_sleeps(ast.parse(code)) == [2]


def test_the_tests_sleep_outside_a_polling_loop_at_most_ten_times():
    sleeps = [
        f"{path.relative_to(TESTS)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in bare_sleeps(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert len(sleeps) <= MOST_BARE_SLEEPS, f"{len(sleeps)} bare time.sleep calls (wait on a condition):\n" + "\n".join(
        sleeps
    )


# A duration: a name that says one, or a clock read subtracted from (time.monotonic() - started).
_DURATION_NAME = re.compile(r"(^|_)(took|elapsed|duration|seconds|secs|waited|latency|times)($|_)", re.IGNORECASE)
_CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns"}

# The few timed assertions left, each for its reason ("path:function" -> why). At most a few.
TIMED_ASSERTIONS_ALLOWED: dict[str, str] = {}
MOST_TIMED_ASSERTIONS_ALLOWED = 3


def _is_clock_read(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _CLOCKS
        and not node.args
    )


def _says_duration(name: str) -> bool:
    """A name for a measured duration; an upper-case one is a setting or a constant: a bound."""
    return bool(_DURATION_NAME.search(name)) and not name.isupper()


def _is_duration(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return _says_duration(node.id)
    if isinstance(node, ast.Attribute):
        return _says_duration(node.attr)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return _says_duration(node.slice.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        return _is_clock_read(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min", "sum", "p99"):
        return any(_is_duration(arg) for arg in node.args)
    return False


def _is_bound(node: ast.AST) -> bool:
    """A number, a name or an attribute (a bound given elsewhere), or arithmetic on them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _is_bound(node.left) and _is_bound(node.right)
    return isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and not _is_duration(node)


def _below(compare: ast.Compare) -> bool:
    """`duration < bound` (or <=), `bound > duration` (or >=), anywhere in a chain."""
    operands = [compare.left, *compare.comparators]
    for op, left, right in zip(compare.ops, operands, operands[1:], strict=False):
        if isinstance(op, (ast.Lt, ast.LtE)) and _is_duration(left) and _is_bound(right):
            return True
        if isinstance(op, (ast.Gt, ast.GtE)) and _is_bound(left) and _is_duration(right):
            return True
    return False


def timed_assertions(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, enclosing function) of each assert that a wall-clock duration stayed below a bound:
    on a loaded machine any such bound is crossed now and then, whatever the code did."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Assert) and any(
                isinstance(n, ast.Compare) and _below(n) for n in ast.walk(child.test)
            ):
                found.append((child.lineno, function))
            visit(child, name)

    visit(tree, "")
    return found


def test_timed_assertions_are_found_whatever_their_spelling():
    code = (
        "def f():\n"
        "    assert took < 2\n"
        "    assert time.monotonic() - started <= bound\n"
        "    assert 5 > elapsed\n"
        "    assert ok and max(seconds) < 1.0, 'x'\n"
        "    assert other == 400 and took < cfg['BUDGET']\n"
        "    assert took >= 0.5 and len(calls) < 3 and gap >= 0.95\n"
        "    assert limit <= served <= limit * 2\n"
        "    assert item['age_seconds'] > LIMIT_SECONDS and took < app.config['BUDGET_SECONDS']\n"
        "    assert page['took_seconds'] < 3\n"
        "    assert p99(times) < 0.2 and len(times) >= 100\n"
    )
    assert [line for line, _ in timed_assertions(ast.parse(code))] == [2, 3, 4, 5, 6, 9, 10, 11]


def test_no_test_asserts_a_wall_clock_duration_stayed_below_a_bound():
    """Assert what made it fast (the calls made, the timeout given, the order of events, a clock
    moved by hand), not how long it took; the few exceptions are named with their reason."""
    assert len(TIMED_ASSERTIONS_ALLOWED) <= MOST_TIMED_ASSERTIONS_ALLOWED
    found: dict[str, list[int]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        for line, function in timed_assertions(ast.parse(path.read_text(), filename=str(path))):
            found.setdefault(f"{path.relative_to(TESTS)}:{function}", []).append(line)
    timed = [f"{where} (lines {lines})" for where, lines in found.items() if where not in TIMED_ASSERTIONS_ALLOWED]
    assert not timed, "timed assertions (assert the mechanism instead):\n" + "\n".join(timed)
    stale = sorted(set(TIMED_ASSERTIONS_ALLOWED) - set(found))
    assert not stale, f"allowed timed assertions no longer there: {stale}"
