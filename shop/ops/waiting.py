"""Work waiting (docs/REFERENCE.md, Operations): the oldest item of each kind that is due and that
no process is working on, with how long it has waited.

An item waits
  - an outbox delivery or a scheduled command: from its `next_attempt_at` while it is `pending`
    and due (nobody has claimed it), or from its `claimed_until` while it is `processing` and that
    claim has lapsed (its holder stopped before finishing: it waits for another to take it over);
  - an RQ job: from its `enqueued_at` while it is in its queue (queue.queue_depths).
Finished work is the lag chart's other half (console.charts); this is the part still waiting,
which a stalled worker makes grow while nothing finishes. Two small queries per table, each over
the (status, next_attempt_at) index or the few claimed rows.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from ..domain.deadlines import as_utc
from ..extensions import db
from ..models import OutboxDelivery, ScheduledCommand, WorkStatus

# Longer than this and the dashboard's "Work waiting" card is red: a worker takes a due item
# within a second or two, and the scheduler finds what Redis lost within a few.
WAITING_LIMIT_SECONDS = 15
KINDS = (("outbox delivery", OutboxDelivery), ("scheduled command", ScheduledCommand))


def _label(row) -> str:
    if isinstance(row, OutboxDelivery):
        return f"outbox delivery {row.id} ({row.handler})"
    return f"scheduled command {row.id} ({row.kind})"


def waiting_in_database(now: datetime) -> list[dict]:
    """Per table and way of waiting (due and unclaimed, or its claim lapsed): how many, and the
    oldest with its age and the identity whose claim lapsed. Only ways that have any."""
    found = []
    for kind, model in KINDS:
        for lapsed, where, since in (
            (False, (model.status == WorkStatus.PENDING, model.next_attempt_at <= now), model.next_attempt_at),
            (True, (model.status == WorkStatus.PROCESSING, model.claimed_until < now), model.claimed_until),
        ):
            count = db.session.execute(select(func.count()).where(*where)).scalar_one()
            if not count:
                continue
            oldest = db.session.execute(select(model).where(*where).order_by(since, model.id).limit(1)).scalar_one()
            at = as_utc(oldest.claimed_until if lapsed else oldest.next_attempt_at)
            found.append(
                {
                    "kind": kind,
                    "count": count,
                    "what": _label(oldest),
                    "code": oldest.handler if isinstance(oldest, OutboxDelivery) else oldest.kind,
                    "id": oldest.id,
                    "since": at,
                    "age_seconds": max(0.0, (now - at).total_seconds()),
                    "claim_lapsed": lapsed,
                    "claimed_by": oldest.claimed_by if lapsed else None,
                }
            )
    return found


def waiting_in_queues(queues: list[dict] | None) -> list[dict]:
    """The RQ queues that hold jobs (queue.queue_depths' `rq queue` rows), as waiting items."""
    return [
        {
            "kind": "RQ job",
            "count": q["depth"],
            "what": f"{q['depth']} job{'' if q['depth'] == 1 else 's'} in RQ queue {q['name']}",
            "code": q["name"],
            "id": None,
            "since": None,
            "age_seconds": float(q["oldest_age_seconds"] or 0),
            "claim_lapsed": False,
            "claimed_by": None,
        }
        for q in queues or ()
        if q.get("kind") == "rq queue" and q["depth"]
    ]


def oldest_waiting(now: datetime, queues: list[dict] | None) -> list[dict]:
    """Everything waiting, the longest-waiting first."""
    return sorted(waiting_in_database(now) + waiting_in_queues(queues), key=lambda w: -w["age_seconds"])
