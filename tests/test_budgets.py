"""The shop's size budgets: no module under shop/ (the Stripe sandbox aside, which mirrors
Stripe's API rather than the shop's) over 400 lines. The function budgets (40 statements, a
complexity of 12) and bugbear are ruff's, in pyproject.toml's [tool.ruff.lint]; this test runs
that lint too, so a breach fails the suite as well as scripts/test's lint step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
OUTSIDE_THE_BUDGET = ROOT / "shop" / "stripe_sandbox"


def _shop_modules() -> list[Path]:
    return [p for p in sorted((ROOT / "shop").rglob("*.py")) if not p.is_relative_to(OUTSIDE_THE_BUDGET)]


def over_budget(paths: list[Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    over = []
    for path in paths:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            over.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}: {lines} lines")
    return over


def test_no_shop_module_is_over_400_lines():
    modules = _shop_modules()
    assert len(modules) > 100, "the walk found too few modules to be the shop's"
    over = over_budget(modules)
    assert over == [], "split these along a real seam (docs/ARCHITECTURE.md names each module):\n" + "\n".join(over)


def test_the_line_budget_catches_a_module_one_line_over(tmp_path):
    """The check above would pass on a walk that read nothing: pin that it counts lines."""
    at_limit, over = tmp_path / "at_limit.py", tmp_path / "over.py"
    at_limit.write_text("x = 1\n" * MAX_MODULE_LINES)
    over.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert over_budget([at_limit, over]) == [f"over.py: {MAX_MODULE_LINES + 1} lines"]


def test_ruff_holds_the_function_budgets_and_bugbear():
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run(
        [str(ruff), "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_lint_selects_the_budgets_and_bugbear():
    """The budgets are settings: pin them, so one dropped from pyproject.toml fails here."""
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    assert {"B", "C901", "PLR0915", "I"} <= set(lint["select"])
    assert lint["pylint"]["max-statements"] == 40
    assert lint["mccabe"]["max-complexity"] == 12
    for ignored in lint["per-file-ignores"].values():
        assert "B" not in ignored, "bugbear applies to tests, benchmarks and the sandbox too"


def test_ruff_finds_a_function_over_the_budget(tmp_path):
    """The lint above would pass if ruff read no file or no setting: pin that it fails a breach."""
    module = tmp_path / "shop_like.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(41))
    module.write_text(f"def too_long():\n{body}\n    return x0\n")
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run(
        [str(ruff), "check", "--config", str(ROOT / "pyproject.toml"), "--output-format", "concise", str(module)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "PLR0915" in result.stdout, result.stdout + result.stderr
