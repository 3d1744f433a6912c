"""The docs name only what exists, and stay short enough to be read (docs/REFERENCE.md, the
preamble; docs/ARCHITECTURE.md). Every path README.md and docs/*.md name under the repository's
own folders (`shop/payments/apply.py`, `shop/outbox/`, `tests/test_layers.py`, `deploy/nginx.conf`)
and every dotted name of the shop's code (`shop.jobs`, `shop.provider.gateway`,
`payments.apply.apply_session`) is checked against the tree as it is when the test runs, by reading
files only: nothing of the shop is imported. So a module renamed or split without its docs fails
here with the doc and the name."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ROOTS = ("shop", "tests", "bench", "deploy", "scripts", "migrations")

# A path under one of the repository's folders, not inside a URL or another path: `shop/x.py`,
# `shop/x/`, `deploy/prometheus/alerts.yml`. Placeholders (`shop/...`, `<name>`) are not paths.
PATH = re.compile(r"(?<![\w./:-])((?:%s)/[\w./-]*)" % "|".join(ROOTS))
# `shop.jobs`, `shop.provider.gateway.ProviderUnavailable`, `shop.stripe_sandbox.testing.running_sandbox()`.
SHOP_DOTTED = re.compile(r"(?<![\w./])shop(?:\.[A-Za-z_]\w*)+")
# Inside backticks, a dotted name relative to shop/: `payments.apply.apply_session`.
BACKTICKED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")

ARCHITECTURE_MAX_WORDS = 6_000
REFERENCE_MAX_WORDS = 16_000
DOC_MAX_LINE = 1_200


def named_paths(text: str) -> set[str]:
    found = set()
    for raw in PATH.findall(text):
        if "..." in raw:
            continue
        path = raw.rstrip(".,;:")
        found.add(path)
    return found


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


@lru_cache(maxsize=None)
def _names_in(path: Path) -> dict[str, ast.AST | None]:
    """What a module defines or imports at its top level, each with its node (a class's, to look
    one level into it)."""
    names: dict[str, ast.AST | None] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = None
    return names


def _has_attributes(module: Path, rest: list[str]) -> bool:
    """`rest` names something in `module`: a top-level name, or a class's member."""
    names = _names_in(module)
    if rest[0] not in names:
        return False
    if len(rest) == 1:
        return True
    node = names[rest[0]]
    if len(rest) == 2 and isinstance(node, ast.ClassDef):
        members = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        members |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        return rest[1] in members
    return False


def resolves(dotted: str) -> bool:
    """`shop.a.b.c`: the longest prefix that is a module, and what is left an attribute of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is not None:
            return cut == len(parts) or _has_attributes(module, parts[cut:])
    return False


def named_dotted(text: str) -> set[str]:
    """Dotted names of the shop's code: every `shop.x...`, and every backticked `pkg.module...`
    whose first two parts are a package of shop/ and a module in it (a column such as
    `orders.browser_id` or an event type such as `checkout.session.completed` is not one)."""
    found = {name.rstrip(".") for name in SHOP_DOTTED.findall(text)}
    for name in BACKTICKED.findall(text):
        parts = name.split(".")
        if parts[0] != "shop" and _module_file(["shop", parts[0]]) and _module_file(["shop", *parts[:2]]):
            found.add("shop." + name)
    return found


@lru_cache(maxsize=1)
def logger_names() -> frozenset[str]:
    """The loggers the code names (`logging.getLogger("shop.provider")`): a log line's `logger`
    is a dotted name the docs may quote that is no module."""
    found = set()
    for path in (ROOT / "shop").rglob("*.py"):
        found |= set(re.findall(r'getLogger\("([\w.]+)"\)', path.read_text(encoding="utf-8")))
    return frozenset(found)


def missing_names(text: str) -> list[str]:
    missing = [path for path in named_paths(text) if not (ROOT / path).exists()]
    missing += [name for name in named_dotted(text) if not resolves(name) and name not in logger_names()]
    return sorted(missing)


def test_every_module_path_and_dotted_name_the_docs_name_exists():
    report = {}
    checked = 0
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        checked += len(named_paths(text)) + len(named_dotted(text))
        missing = missing_names(text)
        if missing:
            report[doc.relative_to(ROOT).as_posix()] = missing
    assert checked > 100, f"the scan found only {checked} names: it no longer reads the docs"
    assert not report, "names in the docs that do not exist in the tree: " + "; ".join(
        f"{doc}: {', '.join(names)}" for doc, names in report.items()
    )


def test_the_scan_finds_paths_and_names_and_tells_a_missing_one_from_prose():
    text = (
        "`shop/payments/apply.py` and shop/outbox/, tests/test_layers.py. `shop/store/orders.py`; "
        "see https://example.com/shop/x.py, `shop.jobs`, `shop.provider.gateway.ProviderUnavailable`, "
        "`payments.apply.apply_session`, `payments.apply.no_such_function`, `shop.no_such_module`, "
        "`orders.browser_id`, `checkout.session.completed`, `shop/...`, https://shop.example.com, "
        "logger `shop.provider` and e.g. the order."
    )
    assert named_paths(text) == {
        "shop/payments/apply.py",
        "shop/outbox/",
        "tests/test_layers.py",
        "shop/store/orders.py",
    }
    assert missing_names(text) == [
        "shop.no_such_module",
        "shop.payments.apply.no_such_function",
        "shop/store/orders.py",
    ]


def test_the_docs_keep_their_word_budgets():
    architecture = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    reference = (ROOT / "docs" / "REFERENCE.md").read_text(encoding="utf-8")
    words = {"ARCHITECTURE": len(architecture.split()), "REFERENCE": len(reference.split())}
    assert words["ARCHITECTURE"] <= ARCHITECTURE_MAX_WORDS, f"docs/ARCHITECTURE.md has {words['ARCHITECTURE']} words"
    assert words["REFERENCE"] <= REFERENCE_MAX_WORDS, f"docs/REFERENCE.md has {words['REFERENCE']} words"


def long_lines(docs: list[Path], limit: int = DOC_MAX_LINE) -> list[str]:
    return [
        f"{doc.name} line {number}: {len(line)} characters"
        for doc in docs
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > limit
    ]


def test_no_doc_has_a_line_over_1200_characters():
    """A longer line is a table row or paragraph grown past reading (and past a diff's width)."""
    assert len(DOCS) >= 5, "the docs were not found"
    found = long_lines(DOCS)
    assert not found, f"lines over {DOC_MAX_LINE} characters: {', '.join(found)}"


def json_in_table_cells(text: str) -> list[str]:
    """Table rows (outside fenced blocks) with a JSON object shape in a cell: `{"` opens one, as
    in `{"id", "kind"}` or `[{"method", "path"}]`. A shape belongs in a fenced json block under
    the table, where it can be read whole; the cell says what the route does."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|") and '{"' in line:
            found.append(f"line {number}: {line.strip()[:80]}")
    return found


def test_no_reference_table_cell_holds_a_json_shape():
    reference = (ROOT / "docs" / "REFERENCE.md").read_text(encoding="utf-8")
    assert reference.count("```json") >= 5, "docs/REFERENCE.md has lost its fenced JSON shapes"
    found = json_in_table_cells(reference)
    assert not found, "JSON shapes in docs/REFERENCE.md table cells (move them to a ```json block): " + "; ".join(found)


def test_the_table_check_tells_a_shape_in_a_cell_from_one_in_a_fenced_block():
    text = (
        "| route | answer |\n| --- | --- |\n"
        "| `GET /a` | JSON (below) |\n"
        '| `GET /b` | JSON `[{"id", "name"}]` |\n'
        "\n```json\n"
        '| `GET /c` | {"id"} |\n'
        "```\n"
        'Prose with `{"id"}` is not a table.\n'
    )
    assert json_in_table_cells(text) == ['line 4: | `GET /b` | JSON `[{"id", "name"}]` |']


def test_the_line_check_catches_a_line_one_character_over(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("a" * DOC_MAX_LINE + "\n" + "b" * (DOC_MAX_LINE + 1) + "\n", encoding="utf-8")
    assert long_lines([doc]) == [f"doc.md line 2: {DOC_MAX_LINE + 1} characters"]
