"""Running spin on model/saga.pml for tests/model/: build a verifier (spin -a, gcc), run it, and
read its verdict; random simulations; and the model's text with one seeded bug planted.

pan's verdict is read from its one summary line, `State-vector N byte, depth reached D, errors: E`
(exactly one such line, or the run is reported as unreadable); "errors: 0" from a search that
did not finish (pan says `Warning: Search not completed`, or that its depth limit was too small)
is not a verdict either."""

from __future__ import annotations

import re
import resource
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

MODEL = Path(__file__).resolve().parent.parent / "model" / "saga.pml"
TOOLS_MISSING = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
SUMMARY = re.compile(r"^State-vector \d+ byte, depth reached (\d+), errors: (\d+)$", re.MULTILINE)
STORED = re.compile(r"^\s*(\d+) states, stored", re.MULTILINE)
DEPTH_LIMIT = 1_000_000

# The exhaustive sizes (model/README.md): stock contention between two orders with one session
# each, and one order through a failed payment and a second session ("Pay now").
TWO_ORDERS = {"N": 2, "STOCK": 1, "MAXS": 1}
ONE_ORDER_TWO_SESSIONS = {"N": 1, "STOCK": 1, "MAXS": 2}
# The same with capture at dispatch (HOLD: card payments held, captured at a ship, voided at a
# cancel, lapsing): two orders for one unit, and one order for the seeded bugs.
TWO_ORDERS_HELD = {"N": 2, "STOCK": 1, "MAXS": 1, "HOLD": 1}
ONE_ORDER_HELD = {"N": 1, "STOCK": 1, "MAXS": 1, "HOLD": 1}
# Beyond them, by random simulation.
LARGER = {"N": 3, "STOCK": 2, "MAXS": 2}
LARGER_HELD = {"N": 3, "STOCK": 2, "MAXS": 1, "HOLD": 1}  # no second session: no failed card payment
LIVENESS = ("final", "restock", "refund")
# The steps only the held journey prints (HOLD=1): not in the conformance test's traces.
HELD_ACTIONS = frozenset(
    {"held", "lapse", "hold_deadline", "ship", "capture", "capture_crashed", "captured", "voided", "operator_cancel"}
)


@dataclass(frozen=True)
class Verdict:
    errors: int
    states: int
    output: str


def _defines(sizes: dict) -> list[str]:
    return [f"-D{name}={value}" for name, value in sorted(sizes.items())]


# Each tool is bounded by the CPU it may spend, not by the wall clock: in a lane niced below
# the rest on a busy machine a search gets a small share of a core, so seconds of wall time say
# nothing of its work. The wall clock only ends a run that is not being scheduled at all.
WALL_BACKSTOP = 3600


def _cpu_limited(seconds: int):
    def limit():
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))

    return limit


def _run_limited(args: list, cwd: Path, cpu_seconds: int) -> subprocess.CompletedProcess:
    done = subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=WALL_BACKSTOP,
        preexec_fn=_cpu_limited(cpu_seconds),
    )
    if done.returncode == -signal.SIGXCPU:  # past the soft limit (the hard one, 5 s later, kills)
        command = " ".join(map(str, args))
        raise AssertionError(f"{command} spent its {cpu_seconds} s of CPU:\n{done.stdout}{done.stderr}")
    return done


def _run(args: list, cwd: Path, cpu_seconds: int) -> str:
    done = _run_limited(args, cwd, cpu_seconds)
    if done.returncode != 0 and args[0] != "./pan":
        raise AssertionError(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


def build(text: str, sizes: dict, workdir: Path, *, liveness: bool = False) -> Path:
    """spin -a and gcc: a safety verifier (-DSAFETY, no never claim) or one for the LTL claims
    (acceptance cycles under weak fairness: one fairness slot per process)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "saga.pml").write_text(text)
    _run(["spin", *_defines(sizes), "-a", "saga.pml"], workdir, 120)
    flags = ["-DNFAIR=20"] if liveness else ["-DSAFETY", "-DNOCLAIM"]
    _run(["gcc", "-w", "-O1", *flags, "-DMEMLIM=3000", "-o", "pan", "pan.c"], workdir, 300)
    return workdir


def verdict(output: str) -> Verdict:
    summaries = SUMMARY.findall(output)
    assert len(summaries) == 1, f"pan's output has {len(summaries)} summary lines:\n{output}"
    errors = int(summaries[0][1])
    if errors == 0:  # pan stops at its first error, and says so the same way
        assert "Search not completed" not in output, f"pan did not finish its search:\n{output}"
        assert "max search depth too small" not in output, f"pan hit its depth limit:\n{output}"
    stored = STORED.search(output)
    assert stored, f"pan's output says no state count:\n{output}"
    return Verdict(errors, int(stored.group(1)), output)


def verify(workdir: Path, ltl: str | None = None, *, fairness: bool = True, cpu_seconds: int = 240) -> Verdict:
    """Run a built verifier: the safety search, or the named LTL property (acceptance cycles),
    with weak fairness unless told otherwise."""
    args = ["./pan", f"-m{DEPTH_LIMIT}"]
    if ltl is not None:
        args += ["-a", *(["-f"] if fairness else []), "-N", ltl]
    return verdict(_run(args, workdir, cpu_seconds))


def simulate(text: str, sizes: dict, seed: int, steps: int, workdir: Path) -> str:
    """One random simulation (spin -n<seed> -u<steps>); its output, the model's STEP lines included."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "saga.pml").write_text(text)
    done = _run_limited(["spin", "-T", *_defines(sizes), f"-n{seed}", f"-u{steps}", "saga.pml"], workdir, 120)
    return done.stdout + done.stderr


def model_text() -> str:
    return MODEL.read_text()


def seeded(old: str, new: str) -> str:
    """The model with `old` (which must occur exactly once) replaced by `new`: a seeded bug whose
    line was renamed fails here instead of silently leaving the model correct."""
    text = model_text()
    assert text.count(old) == 1, f"the seeded bug's line occurs {text.count(old)} times in {MODEL}: {old!r}"
    changed = text.replace(old, new)
    assert changed != text
    return changed
