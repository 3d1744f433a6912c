"""Vocabularies are compared as their enums, never as raw strings: a status, outcome, state or
kind written out as a literal ("noop", "pending") drifts from its StrEnum the day a value is
renamed or a typo slips in, and nothing fails. The stored values, JSON and words are the enums'
own spellings (a StrEnum equals its string), so the check changes no behaviour, only what the
code may write.

The walk covers shop/ outside the Stripe sandbox (which mirrors Stripe's API and stands alone)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE_THE_CHECK = ROOT / "shop" / "stripe_sandbox"

# An attribute that holds a vocabulary's value: `.status`, `.outcome`, `.state`, `.kind`, or one
# ending in `_status`, `_outcome`, `_state`, `_kind` (`view.payment_status`, `row.failure_kind`).
VOCABULARY_ATTRIBUTE = re.compile(r"(^|_)(status|outcome|state|kind)$")
MEMBERSHIP_CALLS = ("in_", "notin_")


def _is_vocabulary_attribute(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and VOCABULARY_ATTRIBUTE.search(node.attr) is not None


def _is_string(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _holds_a_string(node: ast.expr) -> bool:
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_string(e) for e in node.elts)


def _compares_to_a_string(node: ast.Compare) -> bool:
    left = node.left
    for op, right in zip(node.ops, node.comparators, strict=True):
        if isinstance(op, (ast.Eq, ast.NotEq)):
            if (_is_vocabulary_attribute(left) and _is_string(right)) or (
                _is_vocabulary_attribute(right) and _is_string(left)
            ):
                return True
        elif isinstance(op, (ast.In, ast.NotIn)) and _is_vocabulary_attribute(left) and _holds_a_string(right):
            return True
        left = right
    return False


def _sql_membership_of_strings(node: ast.Call) -> bool:
    func = node.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in MEMBERSHIP_CALLS
        and _is_vocabulary_attribute(func.value)
        and bool(node.args)
        and _holds_a_string(node.args[0])
    )


def raw_vocabulary_comparisons(source: str, name: str) -> list[str]:
    """Each comparison in `source` of a vocabulary attribute with a string literal, as
    "name:line: code": ==, !=, in / not in a tuple, list or set holding a string literal, and
    SQLAlchemy's `.in_([...])` / `.notin_([...])`."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if (isinstance(node, ast.Compare) and _compares_to_a_string(node)) or (
            isinstance(node, ast.Call) and _sql_membership_of_strings(node)
        ):
            found.append((node.lineno, node.col_offset, f"{name}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, _, text in sorted(found)]


def _shop_modules() -> list[Path]:
    return [p for p in sorted((ROOT / "shop").rglob("*.py")) if not p.is_relative_to(OUTSIDE_THE_CHECK)]


def test_no_status_outcome_state_or_kind_is_compared_with_a_raw_string():
    modules = _shop_modules()
    assert len(modules) > 100, "the walk found too few modules to be the shop's"
    found = []
    for path in modules:
        found += raw_vocabulary_comparisons(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == [], "compare with the vocabulary's StrEnum member (grep StrEnum in shop/):\n" + "\n".join(found)


def test_the_check_catches_each_shape_of_a_raw_comparison():
    """The walk above would pass on a checker that found nothing: seed each shape it must catch."""
    seeded = "\n".join(
        [
            'if applied.outcome == "noop": pass',
            'if "ok" != cycle.status: pass',
            'if view.payment_status in ("paid", "unpaid"): pass',
            'if row.kind not in ["send_email"]: pass',
            'if warning.state in {"open"}: pass',
            'q = select(Refund).where(Refund.status.in_(("pending", "failed")))',
            'q = select(Receipt).where(Receipt.outcome.notin_(["rejected"]))',
            'if 1 < job.failure_kind == "provider": pass',
        ]
    )
    assert [line.split(":")[1] for line in raw_vocabulary_comparisons(seeded, "seeded.py")] == [
        str(n) for n in range(1, 9)
    ]


def test_the_check_leaves_enum_members_and_other_attributes_alone():
    clean = "\n".join(
        [
            "if applied.outcome is Outcome.NOOP: pass",
            "if view.status == SessionStatus.COMPLETE: pass",
            "q = select(Refund).where(Refund.status.in_((RefundStatus.PENDING, RefundStatus.FAILED)))",
            'if order.reference == "BK-1": pass',  # not a vocabulary
            'if status_line == "ok": pass',  # a name, not an attribute
            'if row.kind_of_thing == "x": pass',  # does not end in _kind
        ]
    )
    assert raw_vocabulary_comparisons(clean, "clean.py") == []
