"""The reconciliation sweep: the backstop for orders nothing else will speak for.

A webhook that never arrives produces no event to compensate, and a deadline row can be missing
(written before the mechanism existed, dead-lettered, deleted by hand). One cycle covers both:

  * one cutoff per cycle (now - RECONCILIATION_STUCK_AGE_SECONDS), two passes against it;
  * the expiry pass FIRST: PendingPayment / PaymentFailed orders last changed before the cutoff
    are cancelled through `orders.cancel.cancel_unpaid`, the deadline's own expiry, whose
    OrderCancelled event restores the stock through the compensation handler. No provider call:
    there is nothing to ask about.
  * then the provider pass: PaymentInitiated orders with a session, last changed before the
    cutoff, are asked about at the provider and the answer applied (`payments.apply.ask_and_apply`),
    the same guarded path as the webhook (PaymentProof, paid -> Paid, expired -> PaymentFailed).
    Expiry runs first because this pass can move an order into PaymentFailed: an expiry pass
    running afterwards against the same cutoff would cancel it at once and erase the retry
    window the failed payment just opened.

Both passes select oldest first, bounded and projected to ids in SQL over
`ix_orders_status_updated_at` (one range scan per status), so a cycle costs the batch, not the
table. Each order is then reloaded and re-checked in its own transaction: one order's failure
never poisons the batch, and a webhook or a customer that moved the order first wins (the
version check turns our late save into a StaleDataError, logged and not retried).

Only one cycle runs anywhere at a time: a row in `leases` taken with a conditional UPDATE (or
an INSERT when absent; the primary key settles a tie), so two scheduler replicas never spend
the same provider call twice. The lease is renewed as it runs down, conditionally on still
holding it, and checked before each order; a cycle that outlived it (a hung provider call, a
paused VM) stops before the next order, because another replica may already be working the same
ids.

Gates, one per consequence: UNPAID_ORDER_EXPIRY_ENABLED decides whether unpaid orders are ever
cancelled automatically (it also gates the per-order deadline at checkout), RECONCILIATION_ENABLED
decides whether we ask the provider. Either can be off while the other runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flask import current_app
from sqlalchemy import or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm.exc import StaleDataError

from .. import failpoints
from ..domain.deadlines import FAILURE_REFUSED, as_utc, next_provider_check, utcnow
from ..domain.order import UNPAID, OrderStatus
from ..extensions import db
from ..models import Lease, Order, ReconciliationCycle, Refund, ScheduledCommand
from ..orders.cancel import cancel_unpaid
from ..outbox import dispatch, uow
from ..outbox.leases import acquire_lease, holder_name, release_lease, renew_lease
from ..payments import apply as payments
from ..payments import gateway, guard
from ..payments.refunds import apply_refund_report
from ..store import orders

log = logging.getLogger("shop.sweep")

LEASE_NAME = "reconciliation-sweep"
# BACKSTOP_RECONCILIATION_LEASE_SECONDS (config RECONCILIATION_LEASE_SECONDS): long enough for
# a batch of slow provider calls between two renewals, short enough that a crashed or frozen
# holder on another machine blocks the next cycle for minutes, not hours.
DEFAULT_LEASE_SECONDS = 300
# After this many provider-unreachable answers in a row the provider pass stops asking: each
# costs a timeout plus retries, and a down provider would otherwise eat the whole lease.
UNAVAILABLE_STREAK_LIMIT = 3
S = OrderStatus

EXPIRY_OUTCOMES = ("cancelled", "lost_race", "changed", "errors")
PROVIDER_OUTCOMES = (
    "paid",
    "payment_failed",
    "cancelled",
    "proof_refused",
    "open",
    "awaiting_async",
    "refund_created",
    "late_refund",
    "refund_under_way",
    "refund_retried",
    "refund_refused",
    "refund_succeeded",
    "refund_failed",
    "watch_closed",
    "changed",
    "unavailable",
    "errors",
)


# -- time ----------------------------------------------------------------------------------


class _Clock:
    """The cycle's clock: the wall clock, or an injected `now` that advances with real elapsed
    time (so a test can put a cycle anywhere in time and the lease still runs out)."""

    def __init__(self, now: datetime | None):
        self._base = as_utc(now) if now is not None else None
        self._t0 = time.monotonic()

    def __call__(self) -> datetime:
        if self._base is None:
            return utcnow()
        return self._base + timedelta(seconds=time.monotonic() - self._t0)


# -- the result ----------------------------------------------------------------------------


def _zeros(keys) -> dict:
    return {k: 0 for k in keys}


@dataclass
class CycleResult:
    status: str  # ok | failed | skipped
    cutoff: datetime
    started_at: datetime
    finished_at: datetime | None = None
    cycle_id: int | None = None
    expiry: dict | None = None  # counts by outcome; None when the pass is turned off
    provider: dict | None = None
    errors: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # not errors: what an operator should still know
    reason: str = ""

    def summary(self) -> dict:
        return {
            "cycle_id": self.cycle_id,
            "status": self.status,
            "reason": self.reason,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "cutoff": self.cutoff.isoformat(),
            "expiry": dict(self.expiry) if self.expiry is not None else None,
            "provider": dict(self.provider) if self.provider is not None else None,
            "errors": list(self.errors),
            "notes": list(self.notes),
        }

    def report_lines(self) -> list[str]:
        head = f"cycle {self.cycle_id if self.cycle_id is not None else '-'}: {self.status}"
        head += f" (cutoff {self.cutoff.isoformat(timespec='seconds')})"
        if self.reason:
            head += f": {self.reason}"
        lines = [head]
        if self.status == "skipped":
            return lines
        lines.append(expiry_line(self.expiry))
        lines.append(provider_line(self.provider))
        lines += [f"note: {note}" for note in self.notes]
        for error in self.errors:
            where = f"order {error.get('reference') or error['order_id']} " if error.get("order_id") is not None else ""
            lines.append(f"error: {where}({error.get('pass', 'cycle')} pass): {error['error']}")
        return lines


def _extras(counts: dict, shown: tuple, labels: dict) -> list[str]:
    return [f"{n} {labels.get(k, k.replace('_', ' '))}" for k, n in counts.items() if k not in shown and n]


def expiry_line(counts: dict | None) -> str:
    if counts is None:
        return "expiry pass: off (UNPAID_ORDER_EXPIRY_ENABLED=false)"
    parts = [f"{counts.get('cancelled', 0)} cancelled", f"{counts.get('lost_race', 0)} lost races"]
    parts += _extras(counts, ("cancelled", "lost_race"), {"changed": "changed meanwhile"})
    return "expiry pass: " + ", ".join(parts)


def provider_line(counts: dict | None) -> str:
    if counts is None:
        return "provider pass: off (RECONCILIATION_ENABLED=false)"
    shown = ("paid", "payment_failed", "unavailable")
    parts = [
        f"{counts.get('paid', 0)} paid",
        f"{counts.get('payment_failed', 0)} payment failed",
        f"{counts.get('unavailable', 0)} unavailable",
    ]
    parts += _extras(
        counts,
        shown,
        {
            "open": "still open",
            "changed": "changed meanwhile",
            "awaiting_async": "awaiting an async payment",
            "cancelled": "cancelled (session expired at the end of the window)",
            "late_refund": "refunds for money that reached a cancelled order",
            "refund_under_way": "late-money refunds still under way (watched)",
            "refund_retried": "dead late-money refunds run again",
            "refund_refused": "late-money refunds refused by the provider (for an operator)",
            "refund_succeeded": "pending late-money refunds the provider says succeeded",
            "refund_failed": "pending late-money refunds the provider says failed (for an operator)",
            "watch_closed": "cancelled orders no longer watched for late money",
            "event_pages": "pages of the provider's events read for many orders in doubt at once",
            "woken": "rows that waited for the provider run now (it answers again)",
        },
    )
    return "provider pass: " + ", ".join(parts)


# -- selection -----------------------------------------------------------------------------


def stuck_query(status, cutoff: datetime, limit: int, *, with_session: bool = False, now: datetime | None = None):
    """One status's oldest stuck orders: a range scan of ix_orders_status_updated_at that stops
    after `limit` rows. With a session (the provider pass), orders the sweep decided to leave
    alone for a while (see `backoff_provider_checks`) are skipped until their time."""
    query = (
        select(Order.updated_at, Order.id)
        .where(Order.status == OrderStatus(status).value, Order.updated_at < cutoff)
        .order_by(Order.updated_at, Order.id)
        .limit(limit)
    )
    if with_session:
        query = query.where(Order.payment_session_id.is_not(None))
        if now is not None:
            query = query.where(or_(Order.provider_next_check_at.is_(None), Order.provider_next_check_at <= now))
    return query


# A refused payment proof cannot change without an operator: ask again after hours, not cycles.
PROOF_REFUSED_BACKOFF_SECONDS = 6 * 3600
# Answers that may change at any moment but usually do not are asked about again at growing
# intervals (domain.deadlines.next_provider_check), never more than this many sweep intervals
# apart, so a lost webhook costs at most about that long: an async payment still settling (the
# order not Paid, or its stock held), and a cancelled order whose session could still take money
# or whose refund has not gone through (a customer's money kept: tighter).
RECHECK_CAP_INTERVALS = {"awaiting_async": 3, "watching": 2}


def backoff_provider_checks(order_id: int, outcome: str, now: datetime, since: datetime | None = None) -> None:
    """Leave the order out of the provider pass for a while after an answer that will not change
    by the next cycle: a refused proof for hours; a payment still settling (or, with `since`, any
    watched cancelled order) progressively, from one interval after `since` up to its cap.

    The order store's `note` of the sweep's own column: bookkeeping, not a state change, so it
    neither bumps the version (a webhook's transition must not lose to it) nor touches
    updated_at (the order's age is what the passes select by)."""
    interval = current_app.config["RECONCILIATION_INTERVAL_SECONDS"]
    if outcome == "proof_refused":
        due = now + timedelta(seconds=max(PROOF_REFUSED_BACKOFF_SECONDS, interval))
    elif since is not None and outcome in RECHECK_CAP_INTERVALS:
        due = next_provider_check(now, since, interval, RECHECK_CAP_INTERVALS[outcome] * interval)
    else:
        return
    orders.note(order_id, "next_check", due)
    db.session.commit()


def stuck_order_ids(
    statuses, cutoff: datetime, limit: int, *, with_session: bool = False, now: datetime | None = None
) -> list[int]:
    """The `limit` oldest orders in `statuses` last changed before `cutoff`, as ids.

    One bounded range scan of (status, updated_at, id) per status, merged here: an IN list over
    two statuses would make PostgreSQL sort every stuck row before the LIMIT, so a large backlog
    would cost the backlog instead of the batch."""
    rows = []
    for status in statuses:
        query = stuck_query(status, cutoff, limit, with_session=with_session, now=now)
        rows.extend((as_utc(updated), order_id) for updated, order_id in db.session.execute(query).all())
    db.session.rollback()  # the selection holds nothing while the orders are worked
    return [order_id for _, order_id in sorted(rows)[:limit]]


# -- one order -----------------------------------------------------------------------------


def expire_stranded_order(order_id: int, cutoff: datetime) -> str:
    """Cancel one unpaid order the selection found, in its own transaction, if it still is
    unpaid and past the cutoff after a fresh load. Returns cancelled | lost_race | changed."""
    session = db.session
    order = orders.read(order_id, fresh=True)
    if order is None or S(order.status) not in UNPAID or as_utc(order.updated_at) >= cutoff:
        session.rollback()
        log.info("sweep: order %s changed since it was selected; the expiry pass leaves it", order_id)
        return "changed"
    with uow.transaction():
        outcome = cancel_unpaid(order)
    if outcome == "lost_race":  # a webhook or the customer won; the next cycle sees the final state
        log.info(
            "sweep: order %s lost a race to another writer while being expired; left as the other writer set it",
            order_id,
        )
    return outcome


def reconcile_stuck_payment(order_id: int, cutoff: datetime, now: datetime) -> str:
    """Ask the provider about one PaymentInitiated order and apply the answer through the
    shared guarded path. No transaction is open during the provider call."""
    checked = _still_stuck(order_id, cutoff)
    if checked is None:
        return "changed"
    session_id, reference, stuck_since = checked
    failpoints.hit("sweep.before_provider_call")
    try:
        answer = payments.ask_and_apply(session_id, source="sweep", now=now)
    except gateway.ProviderUnavailable as exc:
        log.info(
            "sweep: provider unreachable for order %s (session %s): %s; retried next cycle", reference, session_id, exc
        )
        return "unavailable"
    return _after_answer(order_id, answer.view, answer.applied, now, stuck_since)


def _still_stuck(order_id: int, cutoff: datetime) -> tuple[str, str, datetime] | None:
    """(session id, reference, since when it has been stuck) if the order is still waiting at the
    provider past the cutoff after a fresh load, else None. Ends its read transaction."""
    session = db.session
    order = session.get(Order, order_id, populate_existing=True)
    if (
        order is None
        or S(order.status) is not S.PAYMENT_INITIATED
        or not order.payment_session_id
        or as_utc(order.updated_at) >= cutoff
    ):
        session.rollback()
        log.info("sweep: order %s changed since it was selected; the provider pass leaves it", order_id)
        return None
    # The order has been stuck since its window closed: a payment still settling is asked about
    # again soon after that, then less and less often.
    stuck_since = as_utc(order.updated_at) + timedelta(seconds=current_app.config["RECONCILIATION_STUCK_AGE_SECONDS"])
    found = (order.payment_session_id, order.reference, stuck_since)
    session.rollback()
    return found


def _after_answer(order_id: int, view, applied, now: datetime, stuck_since: datetime) -> str:
    """What applying the provider's answer did, as a provider-pass outcome; an answer that cannot
    change soon backs the order off (see backoff_provider_checks)."""
    session = db.session
    outcome = applied.outcome
    if outcome == "noop":
        status = session.execute(select(Order.status).where(Order.id == order_id)).scalar()
        session.rollback()
        if status == S.PAYMENT_INITIATED.value and view.status == "open":
            return "open"
        return "changed"
    if outcome == "already_refunded":
        return "changed"
    backoff_provider_checks(order_id, outcome, now, since=stuck_since if outcome == "awaiting_async" else None)
    return outcome


# -- many orders in doubt at once ------------------------------------------------------------

# With at least this many PaymentInitiated orders in doubt, the provider pass learns their
# sessions' states from the provider's event list (a page of 100 events per call) instead of one
# retrieve per order: after a webhook outage that left a thousand paid orders unconfirmed, one
# retrieve each would be a thousand calls on an endpoint limited to 25 a second, shared with the
# return page and the deadlines. Below it (the steady state: a few stuck orders) nothing changes.
BULK_THRESHOLD = 20
# The bulk path lists at most one page per this many orders in doubt; what it did not find by
# then is asked about one by one, as before.
ORDERS_PER_EVENTS_PAGE = 20
# How many orders in doubt one cycle takes on at most (the per-order pass still takes its batch).
BULK_MAX_ORDERS = 10_000
# The provider keeps events for 30 days: an order older than this is asked about by retrieve.
EVENTS_KEPT = timedelta(days=29)
# A session's events come after its order started the payment; this covers the two clocks.
EVENTS_SLACK = timedelta(minutes=2)


def orders_in_doubt(cutoff: datetime, now: datetime, limit: int) -> list[tuple[int, str, datetime]]:
    """(id, session id, last change) of the PaymentInitiated orders the provider pass would ask
    about, oldest first: one bounded range scan of ix_orders_status_updated_at."""
    query = stuck_query(S.PAYMENT_INITIATED, cutoff, limit, with_session=True, now=now).add_columns(
        Order.payment_session_id
    )
    rows = db.session.execute(query).all()
    db.session.rollback()
    return [(r.id, r.payment_session_id, as_utc(r.updated_at)) for r in rows]


def settle_from_events(
    doubt: list[tuple[int, str, datetime]], cutoff: datetime, counts: dict, errors: list, keep_lease, clock
) -> set[int]:
    """Learn what happened to the sessions of the orders in doubt from the provider's event list
    and apply it: each session's latest event (completed, async succeeded or failed, expired)
    through the same guarded path as the webhook. A session with no event since its order
    started paying is still open, when the list was read to its end. Returns the orders settled
    this way (the per-order pass leaves them); counts the pages read as `event_pages`."""
    now = clock()
    candidates = {sid: oid for oid, sid, updated in doubt if updated > now - EVENTS_KEPT}
    if len(candidates) < BULK_THRESHOLD:
        return set()
    since = min(updated for _, sid, updated in doubt if sid in candidates) - EVENTS_SLACK
    latest: dict[str, gateway.SessionEvent] = {}
    after, more, pages = None, True, 0
    while more and pages < max(1, len(candidates) // ORDERS_PER_EVENTS_PAGE) and len(latest) < len(candidates):
        if not keep_lease():
            raise _LeaseLost("the sweep lease lapsed or was taken over while listing the provider's events")
        try:
            events, more = gateway.session_events(since=since, starting_after=after)
        except gateway.ProviderUnavailable as exc:
            log.info("sweep: could not list the provider's events (%s); asking order by order", exc)
            counts["event_pages"] = counts.get("event_pages", 0) + pages
            return set()
        pages += 1
        for event in events:  # newest first: the first seen of a session is its latest
            if event.view.id in candidates:
                latest.setdefault(event.view.id, event)
        after = events[-1].id if events else None
        more = more and after is not None
    counts["event_pages"] = counts.get("event_pages", 0) + pages
    read_to_end = not more
    settled: set[int] = set()
    for sid, order_id in candidates.items():
        event = latest.get(sid)
        if event is None:
            if read_to_end:  # no news of its session since the order started paying: still open
                settled.add(order_id)
                counts["open"] = counts.get("open", 0) + 1
            continue
        if not keep_lease():
            raise _LeaseLost(f"the sweep lease lapsed or was taken over before order {order_id} (provider pass)")
        settled.add(order_id)
        try:
            outcome = _settle_from_event(order_id, event, cutoff, clock())
        except Exception as exc:
            uow.rollback(db.session)
            log.exception("sweep: applying event %s to order %s failed; continuing with the next", event.id, order_id)
            counts["errors"] += 1
            errors.append(order_error("provider", order_id, exc))
            continue
        counts[outcome] = counts.get(outcome, 0) + 1
    log.info("sweep: %d order(s) in doubt settled from %d page(s) of the provider's events", len(settled), pages)
    return settled


def _settle_from_event(order_id: int, event: gateway.SessionEvent, cutoff: datetime, now: datetime) -> str:
    checked = _still_stuck(order_id, cutoff)
    if checked is None or checked[0] != event.view.id:
        return "changed"
    applied = payments.apply_session(
        event.view, source="sweep", failed=event.failed, now=now, expired_by_cancel=event.expired_by_cancel
    )
    return _after_answer(order_id, event.view, applied, now, checked[2])


def watched_cancelled_ids(now: datetime, limit: int) -> list[int]:
    """Cancelled orders whose session could still take money (see payments.start
    `retire_session_before_cancel`), oldest mark first, skipping those backed off until later. The mark
    is rare and indexed (ix_orders_payment_processing_at), so this reads only marked rows."""
    rows = (
        db.session.execute(
            select(Order.id)
            .where(
                Order.payment_processing_at.is_not(None),
                Order.status == S.CANCELLED.value,
                or_(Order.provider_next_check_at.is_(None), Order.provider_next_check_at <= now),
            )
            .order_by(Order.payment_processing_at, Order.id)
            .limit(limit)
        )
        .scalars()
        .all()
    )
    db.session.rollback()
    return list(rows)


def check_cancelled_payment(order_id: int, now: datetime) -> str:
    """Ask the provider about a cancelled order's session that could still take money: paid ->
    the same late-money path as the webhook (one refund, however often asked); failed, expired or
    gone -> stop watching; still pending (or still open) -> ask again later. The webhook usually
    did this first; this is what makes a lost one harmless.

    Once the money is in, the watch follows its refund until the provider has it: a refund still
    waiting for the provider keeps the order watched, and one that died of anything but a refusal
    runs again (the watch ends only when every refund of the order has succeeded)."""
    session = db.session
    order = session.get(Order, order_id, populate_existing=True)
    if (
        order is None
        or S(order.status) is not S.CANCELLED
        or order.payment_processing_at is None
        or not order.payment_session_id
    ):
        session.rollback()
        return "changed"
    session_id, reference, since = order.payment_session_id, order.reference, as_utc(order.payment_processing_at)
    refunds = session.execute(
        select(Refund.id, Refund.session_id, Refund.status, Refund.provider_refund_id, Refund.settled_at).where(
            Refund.order_id == order_id
        )
    ).all()
    session.rollback()
    if any(r.session_id == session_id for r in refunds):
        return _follow_refunds(
            order_id, reference, [r for r in refunds if r.status != "succeeded" and r.settled_at is None], since, now
        )
    try:
        view = gateway.retrieve_session(session_id)
        failed = payments.async_failed(view)
    except gateway.ProviderUnavailable as exc:
        log.info("sweep: provider unreachable about cancelled order %s (session %s): %s", reference, session_id, exc)
        return "unavailable"
    except gateway.ProviderRefused as exc:  # the session is gone at the provider: nothing can come
        log.info("sweep: session %s of cancelled order %s is gone (%s); no longer watched", session_id, reference, exc)
        orders.note(order_id, "stop_watching")
        session.commit()
        return "watch_closed"
    if view.payment_status == "paid":
        applied = payments.apply_session(view, source="sweep", now=now)
        backoff_provider_checks(order_id, "watching", now, since=since)  # until its refund has gone through
        if applied.outcome == "refund_created":
            log.warning("sweep: money arrived for cancelled order %s with no webhook; refund queued", reference)
            return "late_refund"
        return "refund_under_way"
    if failed or view.status == "expired":
        orders.note(order_id, "stop_watching")
        session.commit()
        return "watch_closed"
    # Still payable (open) or still settling (complete, unpaid): ask again after the backoff.
    backoff_provider_checks(order_id, "watching", now, since=since)
    return "awaiting_async"


def _follow_refunds(order_id: int, reference: str, open_refunds: list, since: datetime, now: datetime) -> str:
    """The late money is in and has a refund: no need to ask about the session any more, only
    whether the money went back. All refunds succeeded (or were settled outside the shop by an
    operator) -> the watch ends. A refund the provider holds as pending is asked about
    (`GET /v1/refunds/{id}`) and its answer applied as its webhook's would be, so a lost
    `refund.failed` still reaches an operator and the customer. A refund command that
    died of anything but the provider's refusal (an outage dead-lettered before waiting for the
    provider existed, a bug since fixed) runs again with a fresh budget; a refused one stays a
    dead letter for an operator, and the order stays watched either way."""
    session = db.session
    open_refund_ids = [r.id for r in open_refunds]
    if not open_refund_ids:
        orders.note(order_id, "stop_watching")
        session.commit()
        log.info("sweep: the late money of cancelled order %s is refunded; no longer watched", reference)
        return "watch_closed"
    commands = session.execute(
        select(
            ScheduledCommand.id, ScheduledCommand.status, ScheduledCommand.failure_kind, ScheduledCommand.payload
        ).where(ScheduledCommand.order_id == order_id, ScheduledCommand.kind == "refund_payment")
    ).all()
    session.rollback()
    dead = [c for c in commands if c.status == "dead" and (c.payload or {}).get("refund_id") in open_refund_ids]
    outcome = _ask_about_pending_refunds(reference, open_refunds, now)
    if outcome == "unavailable":
        return outcome
    if not session.execute(select(Order.payment_processing_at).where(Order.id == order_id)).scalar():
        session.rollback()
        return outcome  # the last refund went through: its success ended the watch
    session.rollback()
    for command in dead:
        if command.failure_kind == FAILURE_REFUSED:
            log.warning(
                "sweep: the refund for cancelled order %s was refused by the provider (cmd-%s); it waits "
                "for an operator in the dead letters",
                reference,
                command.id,
            )
            outcome = "refund_refused"
            continue
        if dispatch.retry_dead("command", command.id, now):
            log.warning(
                "sweep: the refund for cancelled order %s was dead (cmd-%s); running it again", reference, command.id
            )
            outcome = "refund_retried" if outcome != "refund_refused" else outcome
    backoff_provider_checks(order_id, "watching", now, since=since)
    return outcome


def _ask_about_pending_refunds(reference: str, open_refunds: list, now: datetime) -> str:
    """What the provider says now about each refund it holds as pending, applied (payments.refunds);
    the cycle's count for the order: refund_failed, refund_succeeded, refund_under_way, or
    unavailable when the provider could not be asked."""
    outcome = "refund_under_way"
    for refund in open_refunds:
        if refund.status != "pending" or not refund.provider_refund_id:
            continue
        try:
            view = gateway.retrieve_refund(refund.provider_refund_id)
        except gateway.ProviderUnavailable as exc:
            log.info("sweep: provider unreachable about refund %s of cancelled order %s: %s", refund.id, reference, exc)
            return "unavailable"
        except gateway.ProviderRefused as exc:
            log.warning(
                "sweep: the provider refused to say how refund %s (%s) of cancelled order %s stands: %s",
                refund.id,
                refund.provider_refund_id,
                reference,
                exc,
            )
            continue
        report = apply_refund_report(view, source="sweep", now=now)
        if report.outcome in ("refund_failed", "refund_canceled"):
            log.warning(
                "sweep: refund %s of cancelled order %s did not go through at the provider; it waits for an operator",
                refund.id,
                reference,
            )
            outcome = "refund_failed"
        elif report.outcome == "refund_succeeded" and outcome != "refund_failed":
            outcome = "refund_succeeded"
    return outcome


# -- the cycle -----------------------------------------------------------------------------


class _LeaseLost(Exception):
    pass


class _LeaseKeeper:
    """Called before each order: is the lease still ours? Nobody can take it before it lapses,
    so while most of it is left the answer is local; once a third is used it is renewed in the
    database (conditionally, so a lapsed or taken-over lease stays lost)."""

    def __init__(self, holder: str, expires_at: datetime, seconds: float, clock):
        self.holder, self.expires_at, self.seconds, self.clock = holder, expires_at, seconds, clock

    def __call__(self) -> bool:
        now = self.clock()
        if now >= self.expires_at:
            return False
        if (self.expires_at - now).total_seconds() > self.seconds * 2 / 3:
            return True
        if not renew_lease(LEASE_NAME, self.holder, now, self.seconds):
            return False
        self.expires_at = now + timedelta(seconds=self.seconds)
        return True


def error_kind(exc: BaseException) -> str:
    """A stable code for what went wrong, so the console can say it in words and group repeats
    without parsing exception text."""
    if isinstance(exc, gateway.ProviderRefused):
        return "provider_refused"
    if isinstance(exc, gateway.ProviderUnavailable):
        return "provider_unavailable"
    if isinstance(exc, StaleDataError):
        return "conflict"
    if isinstance(exc, SQLAlchemyError):
        return "database"
    return "unexpected"


def order_error(name: str, order_id: int, exc: BaseException) -> dict:
    """One order's failure as recorded in ReconciliationCycle.errors: the pass, the order (its id
    and, for the operator, its reference), a kind code and the exception's text. Reading the
    reference is best effort: a failure of the database itself must not stop the cycle here."""
    reference = None
    try:
        reference = db.session.execute(select(Order.reference).where(Order.id == order_id)).scalar()
        db.session.rollback()
    except Exception:
        uow.rollback(db.session)
    return {
        "pass": name,
        "order_id": order_id,
        "reference": reference,
        "kind": error_kind(exc),
        "error": f"{type(exc).__name__}: {exc}"[:500],
    }


def _run_pass(name: str, ids: list[int], work, counts: dict, errors: list, keep_lease) -> None:
    unavailable_streak = 0
    for position, order_id in enumerate(ids):
        if not keep_lease():
            raise _LeaseLost(
                f"the sweep lease lapsed or was taken over before order {order_id} "
                f"({name} pass); stopped with {len(ids) - position} order(s) left"
            )
        if name == "provider" and unavailable_streak >= UNAVAILABLE_STREAK_LIMIT:
            left = len(ids) - position
            counts["unavailable"] += left
            log.warning(
                "sweep: the payment provider did not answer %d times in a row; %d more order(s) wait "
                "for the next cycle",
                unavailable_streak,
                left,
            )
            return
        try:
            outcome = work(order_id)
        except Exception as exc:
            uow.rollback(db.session)
            log.exception("sweep: %s pass failed on order %s; continuing with the next", name, order_id)
            counts["errors"] += 1
            errors.append(order_error(name, order_id, exc))
            continue
        counts[outcome] = counts.get(outcome, 0) + 1
        unavailable_streak = unavailable_streak + 1 if outcome == "unavailable" else 0
        failpoints.hit("sweep.after_order")
    if name == "provider" and counts.get("unavailable"):
        log.warning(
            "sweep: the payment provider was unreachable for %d order(s); they are retried next cycle",
            counts["unavailable"],
        )


def run_cycle(now: datetime | None = None) -> CycleResult:
    """Run one reconciliation cycle under the sweep lease; record it; return what it did."""
    cfg = current_app.config
    clock = _Clock(now)
    started = clock()
    cutoff = started - timedelta(seconds=cfg["RECONCILIATION_STUCK_AGE_SECONDS"])
    expiry_on, provider_on = cfg["UNPAID_ORDER_EXPIRY_ENABLED"], cfg["RECONCILIATION_ENABLED"]
    lease_seconds = float(cfg.get("RECONCILIATION_LEASE_SECONDS", DEFAULT_LEASE_SECONDS))
    holder = holder_name()
    db.session.rollback()  # start from a clean transaction whatever the caller left behind

    if not (expiry_on or provider_on):
        return _record_skip(CycleResult("skipped", cutoff, started, reason="both passes are turned off"), holder, clock)
    lease = acquire_lease(LEASE_NAME, holder, started, lease_seconds)
    if not lease:
        reason = _lease_held_by_another()
        log.info("sweep: skipped, %s", reason)
        return _record_skip(CycleResult("skipped", cutoff, started, reason=reason), holder, clock)

    result = CycleResult(
        "ok",
        cutoff,
        started,
        expiry=_zeros(EXPIRY_OUTCOMES) if expiry_on else None,
        provider=_zeros(PROVIDER_OUTCOMES) if provider_on else None,
    )
    if lease.taken_from:
        # Not an error of this cycle (it settles the orders that one left), but the console is
        # where an operator learns that a process died in the middle of a cycle.
        result.notes.append(
            f"took over the sweep lease of {lease.taken_from}, a process on this machine "
            "that no longer exists (it died during its cycle)"
        )
    try:
        result.cycle_id = _record_start(result, holder)
        keep_lease = _LeaseKeeper(holder, started + timedelta(seconds=lease_seconds), lease_seconds, clock)
        _run_passes(result, cfg["RECONCILIATION_BATCH_SIZE"], clock, keep_lease)
    except _LeaseLost as exc:
        uow.rollback(db.session)
        log.warning("sweep: %s", exc)
        result.status, result.reason = "failed", "lost the lease"
        result.errors.append({"pass": "cycle", "order_id": None, "kind": "lease_lost", "error": str(exc)})
    except Exception as exc:
        uow.rollback(db.session)
        log.exception("sweep: the cycle failed")
        result.status, result.reason = "failed", f"{type(exc).__name__}"
        result.errors.append(
            {"pass": "cycle", "order_id": None, "kind": error_kind(exc), "error": f"{type(exc).__name__}: {exc}"[:500]}
        )
    finally:
        result.finished_at = clock()
        try:
            _record_finish(result)
        finally:
            release_lease(LEASE_NAME, holder)
    log.info(
        "sweep: cycle %s %s; %s; %s",
        result.cycle_id,
        result.status,
        expiry_line(result.expiry),
        provider_line(result.provider),
    )
    return result


def _run_passes(result: CycleResult, batch: int, clock, keep_lease) -> None:
    """The passes that are on (a pass is on when its counts exist), oldest orders first."""
    cutoff = result.cutoff
    # Expiry first, so an order the provider pass moves to PaymentFailed keeps its window.
    if result.expiry is not None:
        ids = stuck_order_ids(UNPAID, cutoff, batch)
        _run_pass(
            "expiry", ids, lambda oid: expire_stranded_order(oid, cutoff), result.expiry, result.errors, keep_lease
        )
    if result.provider is not None:
        doubt = orders_in_doubt(cutoff, clock(), BULK_MAX_ORDERS)
        settled = (
            settle_from_events(doubt, cutoff, result.provider, result.errors, keep_lease, clock)
            if len(doubt) >= BULK_THRESHOLD
            else set()
        )
        ids = [order_id for order_id, _, _ in doubt if order_id not in settled][:batch]
        _run_pass(
            "provider",
            ids,
            lambda oid: reconcile_stuck_payment(oid, cutoff, clock()),
            result.provider,
            result.errors,
            keep_lease,
        )
        # Then cancelled orders whose money may still come (a lost late-payment webhook).
        ids = watched_cancelled_ids(clock(), batch)
        _run_pass(
            "provider",
            ids,
            lambda oid: check_cancelled_payment(oid, clock()),
            result.provider,
            result.errors,
            keep_lease,
        )
        woken = wake_work_waiting_for_the_provider(clock())
        if woken:
            result.provider["woken"] = woken


def wake_work_waiting_for_the_provider(now: datetime) -> int:
    """Once the provider answers again (the breaker closed and the latest call succeeded), work
    that was backing off for it runs now: a refund held back by an outage is made within one
    sweep interval of the provider's return, not at its next retry, up to 300 s later."""
    view = guard.get().breaker_view()
    if view["state"] != guard.CLOSED or int(view.get("failures") or 0):
        return 0
    woken = dispatch.wake_provider_waiters(now)
    if woken:
        log.info("sweep: the provider answers again; %d row(s) waiting for it run now", woken)
    return woken


def _lease_held_by_another() -> str:
    session = db.session
    current = session.execute(select(Lease.holder, Lease.expires_at).where(Lease.name == LEASE_NAME)).first()
    session.rollback()
    reason = "another cycle holds the sweep lease"
    if current is not None:
        reason += f" ({current.holder}, until {as_utc(current.expires_at).isoformat(timespec='seconds')})"
    return reason


def _record_start(result: CycleResult, holder: str) -> int:
    row = ReconciliationCycle(
        started_at=result.started_at,
        cutoff=result.cutoff,
        status="running",
        holder=holder,
        expiry_counts={},
        provider_counts={},
        errors=[],
        notes=result.notes,
    )
    db.session.add(row)
    db.session.commit()
    return row.id


def _record_finish(result: CycleResult) -> None:
    session = db.session
    if result.cycle_id is None:
        return
    try:
        session.execute(
            update(ReconciliationCycle)
            .where(ReconciliationCycle.id == result.cycle_id)
            .values(
                status=result.status,
                finished_at=result.finished_at,
                expiry_counts=result.expiry or {},
                provider_counts=result.provider or {},
                errors=result.errors,
            )
            .execution_options(synchronize_session=False)
        )
        session.commit()
    except Exception:
        session.rollback()
        log.exception("sweep: could not record the end of cycle %s", result.cycle_id)


def _record_skip(result: CycleResult, holder: str, clock) -> CycleResult:
    session = db.session
    result.finished_at = clock()
    try:
        row = ReconciliationCycle(
            started_at=result.started_at,
            finished_at=result.finished_at,
            cutoff=result.cutoff,
            status="skipped",
            holder=holder,
            expiry_counts={},
            provider_counts={},
            errors=[],
        )
        session.add(row)
        session.commit()
        result.cycle_id = row.id
    except Exception:
        session.rollback()
        log.exception("sweep: could not record a skipped cycle")
    return result
