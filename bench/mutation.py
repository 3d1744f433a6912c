"""Mutation testing: does breaking the code fail a test? mutmut over the core packages
(`.venv/bin/pip install -e '.[dev,mutation]'` first).

    nice -n 10 .venv/bin/python bench/mutation.py                  # every package, in turn
    nice -n 10 .venv/bin/python bench/mutation.py --package saga   # one (repeat --package for more)
    .venv/bin/python bench/mutation.py --report                    # the table from what has run so far
    nice -n 10 .venv/bin/python bench/mutation.py --tests-at main  # the same, with main's tests: a baseline

Each package is mutated with its own tests only, on SQLite (no DATABASE_URL), `-x -m "not slow"`:

    domain  shop/domain/                              tests/domain
    store   shop/store/                               tests/store
    saga    shop/saga/                                tests/saga, tests/payments/test_{operator_refunds,line_restocks}
    outbox  shop/outbox/claims.py, shop/outbox/runner.py  tests/outbox
    checkout  shop/orders/checkout.py                 tests/orders

Why mutmut (3.x) and not cosmic-ray: mutmut runs only the tests that reach a mutant's function, in a process forked from
a warm one, where cosmic-ray rewrites the file and runs the whole test command per mutant (a minute on a loaded machine,
times thousands). mutmut mutates a copy (`mutants/`): the tree stays untouched while tests are written beside a run.

Resumable: each package works in `.mutation/<package>/` (its `mutants/` and mutmut's cache of every verdict); an
interrupted run goes on where it stopped, and a finished one only prints. `--only 'shop.saga.inventory.*'` tries just
the mutants so named (again, if tried before): the most important first when time is short. `--recheck` tries the
survivors again after new tests (with `--baseline REV`: those of the `--tests-at REV` run; `--report --baseline REV`
prints both tables), `--fresh` starts over after the product changed. The tests need Redis at 127.0.0.1:6379: the run
claims a test database the way the suite does (tests/support.py) and hands it to every test run as TEST_REDIS_URL, so
the mutants run one at a time (`--max-children`; more would share it). A mutant costs a fresh import and its tests'
setup (half a minute and more on a shared machine), so a full run of a package takes hours: `--sample 0.1 --seed 1`
tries a random tenth of each module's untried mutants (the same share of every module; the report's `pending` column
is what was left out; mutmut makes the mutants in a package's first run, so there is nothing to draw from before
it, and that first run tries them all), and `--recheck` together with it tries the survivors as well.

mutmut mutates function bodies only: module-level constants (a prebuilt statement, an enum's values) are not
mutated. Each mutant runs in a fresh import of the shop (a fork server that preloads only the libraries), so a
function called while a module is imported (order_statements._guarded) is mutated too.

Per package it prints mutants, killed, survived (with those no test reaches), timed out and the score (killed + timed
out over the mutants tried), then every survivor as file:line and the mutation, with why it is equivalent (no test
can kill it) when bench/mutation_equivalents.txt says so (the score still counts it). A mutant whose test process dies
before any test runs (mutmut's exit code 255: code run at import broke the import) counts as timed out, so as
detected; when most of a run's mutants end so, the runs themselves broke (a pytest setting, the fork server), and the
bench says so and fails.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# BACKSTOP_MUTATION_WORK: another folder, for a second run beside the first on other modules of a package (its own
# Redis database); its `<file>.py.meta` verdicts can be copied into the first's mutants/ for one report.
WORK = Path(os.environ.get("BACKSTOP_MUTATION_WORK", ROOT / ".mutation"))
# What the copied tree needs besides shop/ and tests/ (templates, migrations, docs some tests read).
ALSO = ("migrations", "templates", "static", "docs", "deploy", "app.py", "README.md")
PACKAGES = {
    "domain": (["shop/domain/*"], ["tests/domain"]),
    # shop/saga/operator_refunds.py's and line_restock.py's own tests sit with the refunds they start (tests/payments).
    "saga": (
        ["shop/saga/*"],
        ["tests/saga", "tests/payments/test_operator_refunds.py", "tests/payments/test_line_restocks.py"],
    ),
    "store": (["shop/store/*"], ["tests/store"]),
    "outbox": (["shop/outbox/claims.py", "shop/outbox/runner.py"], ["tests/outbox"]),
    # The checkout's conditional stock decrement (_take_stock) and the rest of the checkout.
    "checkout": (["shop/orders/checkout.py"], ["tests/orders"]),
}
# Imported once by mutmut's fork server, before it forks a process per mutant: the libraries the
# tests import, never the shop itself (each mutant imports the shop afresh, see above).
PRELOAD = ("pytest", "hypothesis", "flask", "flask_sqlalchemy", "flask_migrate", "alembic", "sqlalchemy", "redis")
PRELOAD += ("rq", "rq_scheduler", "stripe", "requests", "psycopg", "flask_wtf", "flask_login", "flask_limiter")
PRELOAD += ("prometheus_client", "babel", "email_validator", "pythonjsonlogger", "werkzeug.test")
KILLED, SURVIVED, NO_TESTS, TIMEOUT, PENDING = "killed", "survived", "no tests", "timeout", "not checked"
# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into the table's columns.
STATUS = {1: KILLED, 3: KILLED, 37: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, 34: NO_TESTS}
STATUS.update({code: TIMEOUT for code in (36, -24, 24, 152, 255)})

LOCKS_URL, LOCK_SECONDS = "redis://127.0.0.1:6379/15", 900  # as tests/support.py claims one

# Left out of a package's mutant runs: the saga model's random interleavings take 100 s and more a run, for every
# mutant of the compensation that survives. A mutant only they would catch counts as a survivor here (the score
# errs low); the fixed journeys of the same model stay in.
LEFT_OUT = {"saga": ["tests/saga/test_saga_model.py::test_random_interleavings_keep_stock_and_money_right"]}

# Functions the shop calls while a module is imported (the order statements build the guarded UPDATEs then)
# or once per process behind a cache (the outbox's claim statements): mutmut ties them to the one test
# that happened to run them first, so their mutants are tried against every test of the package instead.
# mutmut (3.8) mutates no decorated function, so the @functools.cache builders themselves (_claim_one, _claim_many,
# _mark_done, ...) have no mutants: their statements are tried through the mutants of what they call.
CACHED_CLAIMS = ("_claimable", "_claim_values", "_rank", "_first_kinds")
EVERY_TEST = {
    "store": ["shop.store.order_statements.x__guarded", "shop.store.order_statements.x__v"],
    "outbox": [f"shop.outbox.claims.x_{name}" for name in CACHED_CLAIMS],
    # `function@tests`: only the tests whose id starts so. The mail caps' one counting statement is built at import
    # (_emails, _before): tried against the caps' own tests, not every saga test (minutes a mutant).
    "saga": [f"shop.saga.mail_caps.x_{name}@tests/saga/test_mail_caps.py" for name in ("_emails", "_before")],
}


def tie_to_every_test(package: str, folder: Path) -> int:
    """Give EVERY_TEST's functions all of the package's tests (or those named) in mutmut's stats, and forget the
    survivals their mutants got with fewer (a kill stands); how many were forgotten (to try again)."""
    stats_path = folder / "mutants" / "mutmut-stats.json"
    if not stats_path.exists() or not EVERY_TEST.get(package):
        return 0
    mutated = {key.rpartition("__mutmut_")[0] for key in verdicts(folder)}
    tied = dict(entry.partition("@")[::2] for entry in EVERY_TEST[package])  # function: tests' prefix ("": all)
    if unknown := sorted(set(tied) - mutated):  # a function moved: its mutants would keep one test
        raise SystemExit(f"EVERY_TEST names functions with no mutants (moved or renamed?): {', '.join(unknown)}")
    stats = json.loads(stats_path.read_text())
    every, retie = sorted(stats["duration_by_test"]), set()
    for function, prefix in tied.items():
        tests = [test for test in every if test.startswith(prefix)]
        if sorted(stats["tests_by_mangled_function_name"].get(function, [])) != tests:
            stats["tests_by_mangled_function_name"][function] = tests
            retie.add(function)
    if not retie:
        return 0
    stats_path.write_text(json.dumps(stats))
    count = 0
    for path in meta_files(folder):
        meta = json.loads(path.read_text())
        for key in meta["exit_code_by_key"]:
            live = STATUS.get(meta["exit_code_by_key"][key] or 0, SURVIVED) in (SURVIVED, NO_TESTS)
            if key.rpartition("__mutmut_")[0] in retie and meta["exit_code_by_key"][key] is not None and live:
                meta["exit_code_by_key"][key] = None
                count += 1
        path.write_text(json.dumps(meta, indent=4))
    return count


def mutmut_config(package: str) -> str:
    mutate, tests = PACKAGES[package]
    # The fork server imports hypothesis (PRELOAD) before pytest reads its settings: pytest's warning that it cannot
    # rewrite that plugin, an error under filterwarnings, failed every run before a test ran (exit 255).
    pytest_args = ["-m", "not slow", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    for test in LEFT_OUT.get(package, []):
        pytest_args += ["--deselect", test]
    return "\n".join(
        [
            "",
            "[tool.mutmut]",
            'source_paths = ["shop"]',
            f"only_mutate = {json.dumps(mutate)}",
            f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
            f"pytest_add_cli_args = {json.dumps(pytest_args)}",
            f"also_copy = {json.dumps(list(ALSO))}",
            'process_isolation = "forkserver"',
            'forkserver_warmup = "import"',
            'preload_modules_file = "preload.txt"',
            # A test run's setup (imports, the schema) takes seconds on a loaded machine: without room for
            # it, slow survivors counted as timeouts. mutmut's own multiplier (15) let a looping mutant
            # (a drain that never ends) hold the run for minutes; 4 gives it (its tests' time + 10 s) x 4.
            "timeout_constant = 10.0",
            "timeout_multiplier = 4.0",
            "use_git_change_detection = false",
            "",
        ]
    )


def folder_of(package: str, tests_at: str | None) -> Path:
    return WORK / (f"{package}@{tests_at}" if tests_at else package)


def _drop_removed_copies(folder: Path) -> None:
    """mutmut copies the tree into `mutants/` and never deletes from it: a test file removed from
    the tree since would still be collected there (importing what is gone, failing every run)."""
    copies = folder / "mutants"
    for copy in copies.glob("**/*.py") if copies.exists() else ():
        relative = copy.relative_to(copies)
        if not (folder / relative).exists():
            copy.unlink()


def prepare(package: str, fresh: bool, tests_at: str | None = None) -> Path:
    """The package's work folder: links to the tree and a pyproject.toml with its mutmut settings
    (the tree's own pytest settings kept: markers, warnings). `tests_at`: the tests as they were at
    that git revision (a copy), against today's code: the score before the tests written since."""
    folder = folder_of(package, tests_at)
    if fresh and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("shop", *ALSO) if tests_at else ("shop", "tests", *ALSO):
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name)
    if tests_at and not (folder / "tests").exists():
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", tests_at, "tests"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    _drop_removed_copies(folder)
    (folder / "preload.txt").write_text("\n".join(PRELOAD) + "\n")
    text = (ROOT / "pyproject.toml").read_text()
    (folder / "pyproject.toml").write_text(text + mutmut_config(package))
    return folder


class RedisClaim:
    """A test database of the shared Redis, claimed like tests/support.py claims one (so no other
    run uses it meanwhile), renewed while held, flushed and given back at the end."""

    def __init__(self):
        from redis import Redis

        self.locks, self.token, self.index = Redis.from_url(LOCKS_URL), f"mutation-{uuid.uuid4().hex[:8]}", None
        self.stop = threading.Event()

    def __enter__(self) -> str:
        for index in range(1, 15):
            if self.locks.set(self._key(index), self.token, nx=True, ex=LOCK_SECONDS):
                self.index = index
                threading.Thread(target=self._renew, daemon=True).start()
                return LOCKS_URL.rsplit("/", 1)[0] + f"/{index}"
        raise SystemExit("every Redis test database 1-14 is claimed by another run; try again later")

    def _key(self, index: int) -> str:
        return f"backstop-test-run-lock:{index}"

    def _renew(self):
        while not self.stop.wait(60):
            self.locks.expire(self._key(self.index), LOCK_SECONDS)

    def __exit__(self, *exc):
        from redis import Redis

        self.stop.set()
        if self.locks.get(self._key(self.index)) == self.token.encode():
            Redis.from_url(LOCKS_URL.rsplit("/", 1)[0] + f"/{self.index}").flushdb()
            self.locks.delete(self._key(self.index))
        self.locks.close()


def meta_files(folder: Path) -> list[Path]:
    return sorted((folder / "mutants").glob("shop/**/*.py.meta"))


def verdicts(folder: Path) -> dict[str, int | None]:
    """mutmut's exit code per mutant name (None: not tried yet)."""
    codes = {}
    for path in meta_files(folder):
        codes.update(json.loads(path.read_text())["exit_code_by_key"])
    return codes


def survivors(folder: Path) -> list[str]:
    live = (SURVIVED, NO_TESTS, TIMEOUT)
    return sorted(n for n, code in verdicts(folder).items() if code is not None and STATUS.get(code, SURVIVED) in live)


def sample(folder: Path, fraction: float, seed: int) -> list[str]:
    """A random `fraction` of each module's mutants not tried yet (or that no test reached: new tests may), drawn
    per module so every module is sampled alike, and seeded so the same draw can be made again."""
    draw, names = random.Random(seed), []
    for path in meta_files(folder):
        codes = json.loads(path.read_text())["exit_code_by_key"]
        left = sorted(k for k, code in codes.items() if code is None or STATUS.get(code) == NO_TESTS)
        names += draw.sample(left, round(len(left) * fraction))
    return names


def run(package: str, folder: Path, max_children: int, redis_url: str, only: list[str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(TEST_REDIS_URL=redis_url, PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *only]
    print(f"== {package}: {' '.join(command[1:])} (in {folder.relative_to(ROOT)})", flush=True)
    return subprocess.run(command, cwd=folder, env=env).returncode


@dataclass
class Tally:
    package: str
    counts: dict[str, int] = field(default_factory=dict)
    survivors: list[str] = field(default_factory=list)
    explained: int = 0  # survivors EQUIVALENTS explains
    gone: int = 0  # mutants of functions the tree no longer has: left out of every count

    def add(self, status: str) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def row(self) -> str:
        c, total = self.counts.get, self.total
        detected = c(KILLED, 0) + c(TIMEOUT, 0)
        tried = total - c(PENDING, 0)
        score = f"{100 * detected / tried:5.1f}%" if tried else "    -"
        return (
            f"{self.package:<10}{total:>8}{c(KILLED, 0):>8}{c(SURVIVED, 0) + c(NO_TESTS, 0):>10}"
            f"{c(NO_TESTS, 0):>10}{c(TIMEOUT, 0):>10}{c(PENDING, 0):>9}  {score}"
        )


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def function_span(tree: ast.Module, mangled: str) -> tuple[int, int] | None:
    """(first, last) line of the function mutmut names `x_name` or `xǁClassǁname`; None when the
    tree no longer has it (removed since its mutants were made)."""
    parts = mangled[1:].lstrip("_").split("ǁ") if "ǁ" in mangled else [mangled[2:]]
    parts = [p for p in parts if p]
    scope, node = tree.body, None
    for part in parts:
        node = next((n for n in scope if isinstance(n, DEFINITIONS) and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    assert node is not None
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, node.end_lineno


def describe(folder: Path, source: Path, name: str) -> str:
    """`file:line: old -> new` for one mutant, from mutmut's own diff of the function."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=source).splitlines()
    removed = [line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")]
    mangled = name.rpartition(".")[2].rpartition("__mutmut_")[0]
    lines = (folder / source).read_text().splitlines()
    span = function_span(ast.parse("\n".join(lines)), mangled)
    assert span is not None, f"{name}: its function is gone (tally leaves such mutants out)"
    first, last = span
    where = next((n for n in range(first, last + 1) if removed and lines[n - 1].strip() == removed[0]), first)
    return f"{source}:{where}: {' / '.join(removed) or '?'}  ->  {' / '.join(added) or '(removed)'}"


# Survivors no test can kill, each with why: `<mutant name>: <why>` a line. A name holds while its
# function's text does; a survivor of a changed function shows up unexplained, to be looked at again.
EQUIVALENTS = ROOT / "bench" / "mutation_equivalents.txt"


def explained_equivalents() -> dict[str, str]:
    if not EQUIVALENTS.exists():
        return {}
    lines = [line.strip() for line in EQUIVALENTS.read_text().splitlines()]
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def tally(package: str, folder: Path, newer: dict | None = None) -> Tally:
    """The package's verdicts in `folder`; `newer`: verdicts from a later run that win over them
    (the survivors of a baseline tried again with today's tests)."""
    from mutmut.configuration import reset_config

    result, newer = Tally(package), {k: v for k, v in (newer or {}).items() if v is not None}
    equivalent = explained_equivalents()
    here = Path.cwd()
    os.chdir(folder)
    reset_config()
    try:
        for meta_path in meta_files(folder):
            source = meta_path.relative_to(folder / "mutants").with_suffix("")
            tree = ast.parse((folder / source).read_text())
            for name, code in sorted(json.loads(meta_path.read_text())["exit_code_by_key"].items()):
                if function_span(tree, name.rpartition(".")[2].rpartition("__mutmut_")[0]) is None:
                    result.gone += 1  # a function removed since: its mutants no longer exist
                    continue
                code = newer.get(name, code)
                status = PENDING if code is None else STATUS.get(code, SURVIVED)
                result.add(status)
                if status in (SURVIVED, NO_TESTS):
                    mark = " (no test reaches it)" if status == NO_TESTS else ""
                    why = f"\n      equivalent: {equivalent[name]}" if name in equivalent else ""
                    result.explained += bool(why)
                    result.survivors.append(describe(folder, source, name) + mark + f"  [{name}]" + why)
    finally:
        os.chdir(here)
    return result


COLUMNS = (("package", -10), ("mutants", 8), ("killed", 8), ("survived", 10), ("no tests", 10), ("timed out", 10))
HEADER = "".join(f"{n:<{-w}}" if w < 0 else f"{n:>{w}}" for n, w in COLUMNS) + f"{'pending':>9}  score"


def report(tallies: list[Tally]) -> None:
    print()
    print(HEADER)
    overall = Tally("all")
    for t in tallies:
        print(t.row())
        for status, n in t.counts.items():
            overall.counts[status] = overall.counts.get(status, 0) + n
    if len(tallies) > 1:
        print(overall.row())
    print("(survived includes 'no tests'; score = (killed + timed out) / mutants tried, pending left out)")
    for t in tallies:
        if t.gone:
            print(f"{t.package}: {t.gone} mutant(s) of functions removed since left out")
        if t.survivors:
            explained = f", {t.explained} explained as equivalent ({EQUIVALENTS.name})" if t.explained else ""
            print(f"\n{t.package}: {len(t.survivors)} survivor(s){explained}")
            for line in t.survivors:
                print("  " + line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", action="append", choices=list(PACKAGES), help="repeatable; default: all")
    parser.add_argument("--report", action="store_true", help="print what has run so far; run nothing")
    parser.add_argument("--recheck", action="store_true", help="try the survivors again (after new tests)")
    parser.add_argument("--fresh", action="store_true", help="start the package(s) over")
    parser.add_argument("--max-children", type=int, default=1, help="mutants at once (default 1: one Redis database)")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="mutants named so (shop.saga.inventory.*): tried again",
    )
    parser.add_argument("--sample", type=float, metavar="FRACTION", help="try this share of each module's untried")
    parser.add_argument("--seed", type=int, default=0, help="with --sample: which random draw")
    parser.add_argument("--tests-at", metavar="REV", help="use the tests of this git revision (e.g. main): a baseline")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="with --recheck: try the survivors of the --tests-at REV run with today's tests; "
        "with --report: the table before (REV's tests) and after (its survivors tried again)",
    )
    args = parser.parse_args()
    packages = args.package or list(PACKAGES)
    failed = []
    for package in packages:
        folder = prepare(package, args.fresh and not args.report, args.tests_at)
        if args.report:
            continue
        names = list(args.only)
        if args.sample:  # when a full run cannot finish in the time: a fair share of every module
            if not meta_files(folder):  # mutmut makes the mutants in its first run: nothing to draw from yet
                print(f"== {package}: no mutants made here yet, none to sample: this run tries them all", flush=True)
            names += sample(folder, args.sample, args.seed)
            print(f"== {package}: a sample of {len(names)} mutant(s) (seed {args.seed})", flush=True)
        if args.recheck:  # exactly the survivors, tried again (a name given to mutmut is always run)
            names += survivors(folder_of(package, args.baseline) if args.baseline else folder)
            print(f"== {package}: {len(names)} survivor(s) to try again", flush=True)
            if not names:
                continue
        with RedisClaim() as redis_url:
            tie_to_every_test(package, folder)
            code = run(package, folder, args.max_children, redis_url, names)
            if code == 0 and tie_to_every_test(package, folder):  # the stats were new: once more
                code = run(package, folder, args.max_children, redis_url, names)
            codes = [code for code in verdicts(folder).values() if code is not None]  # most at 255: the runs broke
            if code == 0 and len(codes) >= 10 and 2 * codes.count(255) > len(codes):
                print(f"\n{package}: most test runs died before a test ran (exit 255); fix that, then --fresh")
                code = 1
            if code != 0:
                failed.append(package)
    if args.baseline:
        for package in packages:
            before, after = folder_of(package, args.baseline), folder_of(package, None)
            if (before / "mutants").exists():
                print(f"\n## {package}: before (the tests at {args.baseline})")
                report([tally(package, before)])
                print(f"\n## {package}: after (its survivors tried with today's tests)")
                report([tally(package, before, verdicts(after))])
    else:
        folders = [(p, folder_of(p, args.tests_at)) for p in packages]
        report([tally(p, folder) for p, folder in folders if (folder / "mutants").exists()])
    if failed:
        print(f"\nmutmut stopped with an error for: {', '.join(failed)} (its output is above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
