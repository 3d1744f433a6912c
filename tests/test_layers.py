"""The code's shape, checked: the import rules of pyproject.toml's [tool.importlinter] hold
(the layers point one way, web -> use cases -> outbox -> provider -> infrastructure -> queue ->
domain, as docs/ARCHITECTURE.md draws them; no use case imports presentation code; no two packages
import each other; the pure domain imports neither Flask nor SQLAlchemy nor anything else of the
shop; the sandbox stands alone; only shop.provider imports stripe and only shop.queue knows RQ,
each rule naming every other package), no module of the shop is part of an import cycle (grimp's
graph, imports inside functions included), the domain's and the sandbox's tests run with neither
Redis nor a database, as a newcomer's first layer, and the tests keep their own shape: fixtures in
conftest, helpers in support.py, rows built in factories.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_in_pyproject_hold():
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    for contract in (
        "Layers point one way",
        "No use case imports presentation code",
        "No package cycles between the shop's packages",
        "Only shop.provider imports stripe",
    ):
        assert contract in result.stdout, f"the contract {contract!r} did not run"


def top_level_modules() -> set[str]:
    """shop's packages and modules, one level down (shop/__init__.py, the app factory, aside)."""
    shop = ROOT / "shop"
    found = {f"shop.{p.stem}" for p in shop.glob("*.py") if p.name != "__init__.py"}
    found |= {f"shop.{p.parent.name}" for p in shop.glob("*/__init__.py")}
    return found


def _contract(name: str) -> dict:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [found] = [c for c in contracts if c["name"].startswith(name)]
    return found


@pytest.mark.parametrize(
    ("contract", "key", "but"),
    [
        ("Only shop.provider imports stripe", "source_modules", {"shop.provider"}),
        ("Only shop.queue knows RQ", "source_modules", {"shop.queue"}),
        ("The sandbox stands alone", "forbidden_modules", {"shop.stripe_sandbox"}),
        ("The domain is pure", "forbidden_modules", {"shop.domain", "shop.clock"}),
    ],
)
def test_the_only_and_nothing_else_contracts_name_every_other_package(contract, key, but):
    # "Only X imports stripe" holds only for the packages the contract lists: a package added to
    # shop/ and not to the list could import stripe unseen. The lists name packages (and the
    # top-level modules), never single modules inside a package.
    listed = {m for m in _contract(contract)[key] if m.startswith("shop")}
    assert len(top_level_modules()) > 30, "the walk found too few of the shop's packages"
    wanted = top_level_modules() - but
    assert listed == wanted, f"missing: {sorted(wanted - listed)}; not a top-level package: {sorted(listed - wanted)}"


@pytest.mark.parametrize("layer", ["tests/domain", "tests/sandbox"])
def test_the_domain_and_sandbox_tests_need_neither_redis_nor_a_database(layer, request):
    # Nothing listens on port 9: a test (or conftest) that reached for Redis or the database fails.
    nowhere = {
        "TEST_REDIS_LOCKS_URL": "redis://127.0.0.1:9/15",
        "DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/nothing",
    }
    env = {k: v for k, v in os.environ.items() if k != "TEST_REDIS_URL"}
    if env == {**env, **nowhere} and "TEST_REDIS_URL" not in os.environ:
        # This run is itself without stores (scripts/test's no-store lane): the layer's tests,
        # collected into it, are the proof, and running them again in a child would only repeat it.
        ran_here = [item for item in request.session.items if item.nodeid.startswith(f"{layer}/")]
        if ran_here:
            assert len(ran_here) > 20, f"only {len(ran_here)} tests of {layer} in this run"
            return
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", layer],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, **nowhere},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "error" not in result.stdout.splitlines()[-1]


def test_no_test_module_imports_conftest_and_only_the_factories_build_carts():
    # conftest holds fixtures only (helpers are in support.py); a cart, and so an order, is built
    # in one place (factories.py), so a change to how orders are made is made once.
    imports_conftest = re.compile(r"^\s*(from\s+(tests\.)?conftest\s+import|import\s+(tests\.)?conftest)", re.M)
    builds_cart = re.compile(r"\b(Cart|CartItem)\(")
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(ROOT)
        if imports_conftest.search(text):
            offenders.append(f"{name} imports conftest")
        if path.name != "factories.py" and builds_cart.search(text):
            offenders.append(f"{name} builds a cart itself (use factories.cart_with / place_order_for)")
    assert not offenders, offenders


def modules_in_cycles(graph, package: str, outside: tuple[str, ...] = ()) -> list[list[str]]:
    """The import cycles among `package`'s modules (each a strongly connected group of two or
    more modules that reach one another, or a module importing itself), as sorted lists.
    grimp's graph holds every import, those inside functions and under TYPE_CHECKING included,
    so a cycle deferred into a function body is still one."""

    def inside(module: str) -> bool:
        return (module == package or module.startswith(package + ".")) and not any(
            module == o or module.startswith(o + ".") for o in outside
        )

    modules = sorted(m for m in graph.modules if inside(m))
    imports = {m: sorted(t for t in graph.find_modules_directly_imported_by(m) if inside(t)) for m in modules}
    # Tarjan's strongly connected components, without recursion (the shop has hundreds of modules).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(imports[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(imports[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in imports[node]:
                    groups.append(sorted(group))
    return sorted(groups)


def test_no_module_of_the_shop_is_part_of_an_import_cycle():
    # The sandbox stands apart (its own contract above); every other module of shop/ imports only
    # what sits below it, even in a function body: a deferred import that closes a cycle is still
    # two modules that cannot be understood, tested or moved one without the other.
    import grimp

    graph = grimp.build_graph("shop", cache_dir=None)
    assert len(graph.modules) > 100, "the graph found too few modules to be the shop's"
    cycles = modules_in_cycles(graph, "shop", outside=("shop.stripe_sandbox",))
    details = [
        f"{a} -> {b} (lines {[d['line_number'] for d in graph.get_import_details(importer=a, imported=b)]})"
        for group in cycles
        for a in group
        for b in group
        if graph.direct_import_exists(importer=a, imported=b)
    ]
    assert cycles == [], "modules that import one another:\n" + "\n".join(details)


def test_the_cycle_check_finds_a_cycle_closed_inside_a_function(tmp_path, monkeypatch):
    """The check above would pass on a graph it did not read: pin that it sees a cycle whose one
    import is deferred into a function, a three-module ring, and nothing in a tree without one."""
    import grimp

    package = tmp_path / "ringpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "apply.py").write_text("from . import unknown\n")
    (package / "unknown.py").write_text("def settle():\n    from .apply import x\n    return x\n")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("from . import c\n")
    (package / "c.py").write_text("import ringpkg.a\n")
    (package / "leaf.py").write_text("from . import apply\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    graph = grimp.build_graph("ringpkg", cache_dir=None)
    found = modules_in_cycles(graph, "ringpkg")
    assert ["ringpkg.apply", "ringpkg.unknown"] in found
    assert ["ringpkg.a", "ringpkg.b", "ringpkg.c"] in found
    assert all("ringpkg.leaf" not in group for group in found)
    # Leaving a module out (as the shop leaves out its sandbox) leaves out the cycles through it.
    assert modules_in_cycles(graph, "ringpkg", outside=("ringpkg.unknown",)) == [
        ["ringpkg.a", "ringpkg.b", "ringpkg.c"]
    ]
