"""The dashboard's "Work waiting" card (docs/REFERENCE.md, Console): red when the oldest due item
(ops.waiting) has waited more than WAITING_LIMIT_SECONDS, naming it, how long, and who should be
taking it: the worker whose claim lapsed, and the workers registered with their node and pid."""

from __future__ import annotations

from datetime import datetime

from flask import url_for

from ..ops.waiting import WAITING_LIMIT_SECONDS, oldest_waiting
from .format import human_age
from .ops_words import queue_words
from .words import command_words, handler_words

KIND_WORDS = {"outbox delivery": handler_words, "scheduled command": command_words}


def _what(item: dict) -> str:
    """An item as the card says it: its handler's or command kind's words, then which row it is
    (`Put the stock back (outbox delivery 12)`); the code stays in the card's `items`."""
    say = KIND_WORDS.get(item["kind"])
    if say is None:  # jobs queued in Redis: `code` is the queue's name
        n, queue = item["count"], queue_words({"name": item["code"], "kind": "rq queue"})
        return f"{n} job{'' if n == 1 else 's'} waiting in Redis ({queue})"
    return f"{say(item['code'])} ({item['kind']} {item['id']})"


def _worker_words(p: dict) -> str:
    state = f"stalled, last heard from {human_age(p['beat_age_seconds'])} ago" if p["stalled"] else "beating"
    return f"{p['name']} (node {p['node'] or '(unnamed)'}, pid {p['pid']}, {state})"


def _holder_words(item: dict, workers: list[dict]) -> str:
    """The process whose claim lapsed, found by its identity (`node:pid:thread`)."""
    node, _, rest = (item["claimed_by"] or "").partition(":")
    pid = rest.partition(":")[0]
    match = next((p for p in workers if p["node"] == node and str(p["pid"]) == pid), None)
    holder = _worker_words(match) if match else f"{item['claimed_by']} (node {node}, pid {pid}, no longer registered)"
    return f" Its claim, held by {holder}, lapsed {human_age(item['age_seconds'])} ago."


def waiting_card(data: dict, now: datetime, card) -> dict:
    """`card`: board._card, the dashboard's one card shape."""
    items = oldest_waiting(now, data.get("queues"))
    workers = [p for p in data["processes"] if p["role"] == "worker"]
    late = [w for w in items if w["age_seconds"] > WAITING_LIMIT_SECONDS]
    if not items:
        words = "Nothing due is waiting."
    else:
        first = items[0]
        words = (
            f"The oldest waiting: {_what(first)}, waiting {human_age(first['age_seconds'])}"
            + (f" (and {first['count'] - 1} more like it)" if first["count"] > 1 and first["id"] is not None else "")
            + "."
        )
        if first["claim_lapsed"]:
            words += _holder_words(first, workers)
        others = [f"{_what(w)}, {human_age(w['age_seconds'])}" for w in items[1:4]]
        if others:
            words += " Also waiting: " + "; ".join(others) + "."
    if late:
        words += (
            " Workers that should take it: " + "; ".join(_worker_words(p) for p in workers) + "."
            if workers
            else " No worker is registered to take it."
        )
    result = card(
        "waiting",
        "Work waiting",
        not late,
        len(late),
        words,
        f"Due work is taken within a second or two: over {WAITING_LIMIT_SECONDS} s means no worker is taking it. "
        "Restart the stalled worker named here (or start one); Processes says which are beating.",
        url_for("console.outbox", status="waiting"),
        condition=",".join(sorted({p["name"] for p in workers if p["stalled"]})) + f":{bool(workers)}",
    )
    result["limit_seconds"] = WAITING_LIMIT_SECONDS
    result["oldest_seconds"] = items[0]["age_seconds"] if items else None  # the lag chart's current minute
    result["items"] = [
        {k: v for k, v in w.items() if k != "since"} | {"since": w["since"].isoformat() if w["since"] else None}
        for w in items
    ]
    return result
