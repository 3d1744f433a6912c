"""Retention: how long each kind of finished record is kept before the prune removes it
(docs/REFERENCE.md, Settings: RETENTION_DAYS, AUDIT_RETENTION_DAYS). Pure: every cutoff is a
function of `now` and the two settings, so the rules are tested without a database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

# Stripe retries a webhook for up to 3 days (its webhooks page); a receipt must outlive every
# retry of its event, with room for an outage of ours on top, whatever RETENTION_DAYS says.
WEBHOOK_RECEIPT_MIN_DAYS = 7
# The dedup row of an applied provider event (processed_stripe_events) is kept while the provider
# still lists the event (GET /v1/events shows the last 30 days, and the sweep's in-doubt pass reads
# that list): an event the shop can still be shown is never taken for a new one. Applying one
# twice would be refused by the order's guarded transitions anyway; the row saves the work.
PROVIDER_EVENT_MIN_DAYS = 30


@dataclass(frozen=True)
class Cutoffs:
    """Rows older than these (and finished, and owed to no one) may go."""

    work: datetime  # done or discarded deliveries, done or obsolete scheduled commands
    receipts: datetime  # webhook receipts
    provider_events: datetime  # dedup rows of applied provider events
    cycles: datetime  # finished sweep cycles
    audit: datetime  # operator actions
    answers: datetime  # the first answers of requests sent with an Idempotency-Key (a day)


def cutoffs(now: datetime, retention_days: int, audit_retention_days: int) -> Cutoffs:
    """The cutoffs of a prune run at `now`."""
    days = timedelta(days=retention_days)
    return Cutoffs(
        work=now - days,
        receipts=now - max(days, timedelta(days=WEBHOOK_RECEIPT_MIN_DAYS)),
        provider_events=now - max(days, timedelta(days=PROVIDER_EVENT_MIN_DAYS)),
        cycles=now - days,
        audit=now - timedelta(days=audit_retention_days),
        answers=now - timedelta(days=1),
    )
