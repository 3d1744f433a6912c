"""The dashboard's machinery in words: a process's state, the job it runs, a queue and a node's
state, as an operator reads them on the page. The JSON keeps the codes (docs/REFERENCE.md,
Console), and the page keeps each code behind its "Technical detail" toggle. An unknown code is
shown as it is, never hidden."""

from __future__ import annotations

from ..ops import nodes

# A process's state: RQ's worker states (rq.worker.WorkerStatus), a scheduler's, or stalled.
PROCESS_WORDS = {
    "idle": "waiting for work",
    "busy": "working",
    "starting": "just started",
    "started": "just started",
    "suspended": "suspended by an operator",
    "polling": "checking for due work",
    "record expired": "no longer recorded in Redis",
    "stalled": "stalled: not heard from",
}

# The shop's RQ jobs (shop/jobs.py), by the function name a process's heartbeat records.
JOB_WORDS = {
    "run_delivery": "running an event delivery",
    "drain": "running due event deliveries",
    "drain_commands": "running due scheduled commands",
    "run_command": "running a scheduled command",
    "relay": "waking work a lost wake-up left behind",
    "reconcile": "the reconciliation sweep",
    "resume_sweep": "taking over an unfinished sweep",
    "prune": "pruning finished records",
}

QUEUE_KIND_WORDS = {
    "rq queue": "jobs waiting in Redis",
    "schedule": "timed jobs in Redis",
    "database": "due work in the database",
}

NODE_WORDS = {
    nodes.UP: "up",
    nodes.STALLED: "a process stalled",
    nodes.GONE: "gone",
    nodes.UNSEEN: "not seen",
}

ROLE_WORDS = {"worker": "Worker", "scheduler": "Scheduler"}


def process_words(state: str | None) -> str:
    return PROCESS_WORDS.get(state or "", state or "–")


def job_words(job: str | None) -> str:
    """`drain(3)` -> "running due event deliveries"; a job the shop does not know, as it is."""
    if not job:
        return "–"
    return JOB_WORDS.get(job.partition("(")[0], job)


def queue_words(queue: dict) -> str:
    """A queue as the dashboard names it: what it holds, by its kind and name."""
    name, kind = queue["name"], queue["kind"]
    if kind == "rq queue":
        if name.endswith("-control"):
            return "Control jobs (sweep, relay, prune, payment queue)"
        if name.endswith("-work"):
            return "Work jobs (deliveries and commands)"
    if kind == "schedule":
        return "Timed jobs (deadlines' and retries' wake-ups)"
    if kind == "database":
        return f"Due {name}"
    return name


def queue_kind_words(kind: str) -> str:
    return QUEUE_KIND_WORDS.get(kind, kind)


def node_state_words(state: str) -> str:
    return NODE_WORDS.get(state, state)


def role_words(role: str) -> str:
    return ROLE_WORDS.get(role, role)


def waiting_codes(items: list[dict]) -> list[tuple[str, str]]:
    """The "Work waiting" card's items behind its Technical detail: which row, and its code."""
    return [(f"{w['kind']} {w['id']}" if w["id"] is not None else w["kind"], w["code"]) for w in items[:4]]


OPS_TEMPLATE_WORDS = {
    "process_words": process_words,
    "job_words": job_words,
    "queue_words": queue_words,
    "queue_kind_words": queue_kind_words,
    "node_state_words": node_state_words,
    "role_words": role_words,
    "waiting_codes": waiting_codes,
}
