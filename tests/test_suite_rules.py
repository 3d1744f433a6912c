"""Rules of the suite itself: the tests wait on conditions (support.wait_until, poll_until) or
move a fake clock, not on the clock; the few sleeps left are a fault's own length, each saying so."""

from __future__ import annotations

import ast
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
