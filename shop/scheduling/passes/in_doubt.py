"""The provider pass with many orders in doubt at once (after a webhook outage, say): their
sessions' states are read from the provider's event list, a page for many orders, instead of
one retrieve per order, and applied through the webhook's guarded path."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from ...domain.deadlines import as_utc
from ...domain.order import OrderStatus
from ...extensions import db
from ...models import Order
from ...outbox import uow
from ...payments import apply as payments
from ...payments import holds
from ...payments.refunds import late_money_reason
from ...provider import gateway
from ..cycle import PassName, ProviderOutcome, Tally, order_error
from ..lease import LeaseLost
from ..stuck import stuck_query
from .provider import after_answer, still_stuck

log = logging.getLogger("shop.sweep")
S = OrderStatus

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
    through the same guarded path as the webhook; a completed unpaid one that may hold a card
    payment (holds.may_be_held) is left to the per-order pass, whose answer shows the payment. A
    session with no event since its order started paying is still open, when the list was read
    to its end. Returns the orders settled
    this way (the per-order pass leaves them); counts the pages read as `event_pages`."""
    now = clock()
    candidates = {sid: oid for oid, sid, updated in doubt if updated > now - EVENTS_KEPT}
    if len(candidates) < BULK_THRESHOLD:
        return set()
    since = min(updated for _, sid, updated in doubt if sid in candidates) - EVENTS_SLACK
    latest, read_to_end, pages, listed = _latest_events(candidates, since, keep_lease)
    counts[Tally.EVENT_PAGES] = counts.get(Tally.EVENT_PAGES, 0) + pages
    if not listed:
        return set()
    refunds = _refunds_of_paid(latest, since)
    if refunds is None:
        return set()  # the per-order pass asks about each, its refunds included
    settled: set[int] = set()
    for sid, order_id in candidates.items():
        event = latest.get(sid)
        if event is None:
            if read_to_end:  # no news of its session since the order started paying: still open
                settled.add(order_id)
                counts[ProviderOutcome.OPEN] = counts.get(ProviderOutcome.OPEN, 0) + 1
            continue
        if holds.may_be_held(event.view):
            continue  # the event does not say whether the payment is held: the per-order pass asks
        if not keep_lease():
            raise LeaseLost(f"the sweep lease lapsed or was taken over before order {order_id} (provider pass)")
        settled.add(order_id)
        try:
            outcome = _settle_from_event(order_id, event, cutoff, clock(), refunds)
        except Exception as exc:
            uow.rollback(db.session)
            log.exception("sweep: applying event %s to order %s failed; continuing with the next", event.id, order_id)
            counts[Tally.ERRORS] += 1
            errors.append(order_error(PassName.PROVIDER, order_id, exc))
            continue
        counts[outcome] = counts.get(outcome, 0) + 1
    log.info("sweep: %d order(s) in doubt settled from %d page(s) of the provider's events", len(settled), pages)
    return settled


def _latest_events(candidates: dict, since: datetime, keep_lease) -> tuple[dict, bool, int, bool]:
    """The latest event of each candidate session, from the provider's event list read page by
    page (at most one page per ORDERS_PER_EVENTS_PAGE orders): (the events by session, whether
    the list was read to its end, the pages read, False when the provider did not answer)."""
    latest: dict[str, gateway.SessionEvent] = {}
    after, more, pages = None, True, 0
    while more and pages < max(1, len(candidates) // ORDERS_PER_EVENTS_PAGE) and len(latest) < len(candidates):
        if not keep_lease():
            raise LeaseLost("the sweep lease lapsed or was taken over while listing the provider's events")
        try:
            events, more = gateway.session_events(since=since, starting_after=after)
        except gateway.ProviderUnavailable as exc:
            log.info("sweep: could not list the provider's events (%s); asking order by order", exc)
            return latest, False, pages, False
        pages += 1
        for event in events:  # newest first: the first seen of a session is its latest
            if event.view.id in candidates:
                latest.setdefault(event.view.id, event)
        after = events[-1].id if events else None
        more = more and after is not None
    return latest, not more, pages, True


def _refunds_of_paid(latest: dict, since: datetime) -> list | None:
    """The provider's refunds since `since` when a session in the list was paid: a restored copy
    must not take as payment money the machine it replaces already gave back as late money (the
    same question ask_and_apply asks of one session). None when the provider did not answer."""
    if not any(e.view.payment_status == gateway.SessionPaymentStatus.PAID for e in latest.values()):
        return []
    try:
        return gateway.refunds_since(since)
    except gateway.ProviderUnavailable as exc:
        log.info("sweep: could not list the provider's refunds (%s); asking order by order", exc)
        return None


def _settle_from_event(
    order_id: int, event: gateway.SessionEvent, cutoff: datetime, now: datetime, refunds: list
) -> ProviderOutcome:
    checked = still_stuck(order_id, cutoff)
    if checked is None or checked[0] != event.view.id:
        return ProviderOutcome.CHANGED
    applied = payments.apply_session(
        event.view,
        source="sweep",
        failed=event.failed,
        now=now,
        expired_by_cancel=event.expired_by_cancel,
        refunded_as=late_money_reason(event.view, refunds) if refunds else None,
    )
    return after_answer(order_id, event.view, applied, now, checked[2])
