"""The scan for money no order holds: the provider's completed payments, read in windows of their
creation time from a mark kept in the database, each applied through the webhook's guarded path
unless an order already holds it as its payment or the shop already refunds it.

It is how a database restored from a copy finds the payments made after the copy was taken: the
copy's mark is as old as the copy, so its first cycles read everything the provider took since,
including payments whose webhooks the lost machine answered. Such a payment is applied to its
order when the copy has the order and it can still take the money (the order is paid, adopting
the session it never saw), refunded as late money when it cannot, recorded as the refund the
provider already holds when the lost machine gave it back (its order cancelled, as that machine
had it, rather than paid with money that is gone), and, when the copy has no such
order at all, recorded as unknown money and refunded (shop.payments.unknown_money). In steady
state it reads about one page of 100 events per 100 payments, a small share of the provider
budget next to the calls each payment makes anyway."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from ...domain.order import OrderStatus
from ...extensions import db
from ...models import KeyValue, Order, Refund, UnknownPayment
from ...outbox import uow
from ...payments import apply as payments
from ...payments import holds, refunds
from ...provider import gateway
from ..cycle import PassName, Tally, error_kind, not_asked
from ..lease import LeaseLost
from ..stuck import stuck_age

log = logging.getLogger("shop.sweep")

MARK_KEY = "unknown_money_scan_mark"
# Payments this recent are left to their webhook and the next cycle: the provider's clock and
# ours differ by a little (`flask shop check` holds it under 2 s), and its list lags its writes.
# A shop whose stuck age is shorter (RECONCILIATION_STUCK_AGE_SECONDS) waits that long instead.
SETTLE_LAG = timedelta(seconds=60)
# A cycle reads only once this much has gathered past the mark: one list call per half minute
# at most, however often the sweep runs.
SCAN_GAP = timedelta(seconds=30)
# One window of creation time per list walk, halved while a window holds more than PAGE_CAP pages.
MAX_WINDOW = timedelta(days=1)
MIN_WINDOW = timedelta(seconds=1)
PAGE_CAP = 20
# At most this many windows per cycle: a copy days behind catches up over several cycles.
WINDOWS_PER_CYCLE = 24
# Payments looked up at once when checking which of a window's are already held.
HELD_CHUNK = 500


def read_mark() -> datetime | None:
    row = db.session.get(KeyValue, MARK_KEY)
    db.session.rollback()
    return None if row is None else datetime.fromtimestamp(int(row.value), timezone.utc)


def _write_mark(at: datetime) -> None:
    with uow.transaction():
        row = db.session.get(KeyValue, MARK_KEY)
        if row is None:
            db.session.add(KeyValue(key=MARK_KEY, value=str(int(at.timestamp()))))
        else:
            row.value = str(int(at.timestamp()))


def _whole_second(at: datetime) -> datetime:
    return at.replace(microsecond=0)


def _count(counts: dict, key) -> None:
    counts[key] = counts.get(key, 0) + 1


def scan_for_unknown_money(counts: dict, errors: list, keep_lease, clock) -> None:
    """Read the provider's completed payments from the mark up to a minute ago, window by window,
    applying each no order already holds; the mark moves past a window once it was read whole."""
    lag = min(SETTLE_LAG, stuck_age())
    mark = read_mark()
    if mark is None:
        # The first cycle of a new database (or of one from before the scan): nothing older can be
        # a payment for an order it lacks. A restored copy has the mark of its last cycle.
        _write_mark(_whole_second(clock() - lag))
        return
    if _whole_second(clock() - lag) - mark < SCAN_GAP:
        return
    window = MAX_WINDOW
    for _ in range(WINDOWS_PER_CYCLE):
        end = min(_whole_second(clock() - lag), mark + window)
        if end <= mark:
            return
        if not keep_lease():
            raise LeaseLost("the sweep lease lapsed or was taken over while scanning the provider's payments")
        try:
            events = _read_window(mark, end, counts)
        except gateway.ProviderUnavailable as exc:
            log.info("sweep: could not list the provider's payments (%s); the next cycle reads from the same mark", exc)
            _count(counts, not_asked(exc))
            return
        if events is None and window > MIN_WINDOW:
            window = max(MIN_WINDOW, window / 4)  # too many payments in it: a smaller window, same start
            continue
        try:
            held = _held_sessions([event.view.id for event in events or []])
            for event in events or []:
                if event.view.id not in held:
                    _apply(event, counts, errors, clock)
        except gateway.ProviderUnavailable as exc:
            # What was applied stays applied (held: the next read skips it); the rest is read again.
            log.info(
                "sweep: could not ask the provider about a payment's refunds (%s); the next cycle reads again", exc
            )
            _count(counts, not_asked(exc))
            return
        _write_mark(end)
        mark = end
        window = min(MAX_WINDOW, window * 2)


def _read_window(since: datetime, until: datetime, counts: dict) -> list | None:
    """All completed-payment events created in [since, until), or None when there are more than
    PAGE_CAP pages of them. ProviderUnavailable reaches the caller (the cycle retries next time)."""
    found, after = [], None
    for _ in range(PAGE_CAP):
        page, more = gateway.paid_session_events(since=since, until=until, starting_after=after)
        _count(counts, Tally.MONEY_PAGES)
        found.extend(e for e in page if _took_money(e.view) and e.view.id)
        if not more or not page:
            return found
        after = page[-1].id
    return None


def _took_money(view: gateway.SessionView) -> bool:
    """Paid, or (CAPTURE_MODE=dispatch) completed unpaid: perhaps a card payment held, which only
    the session read with its payment tells."""
    return view.payment_status == gateway.SessionPaymentStatus.PAID or holds.may_be_held(view)


def _apply(event: gateway.SessionEvent, counts: dict, errors: list, clock) -> None:
    sid = event.view.id
    refunded_as = None if holds.may_be_held(event.view) else refunds.refunded_by_shop(event.view)
    try:
        if holds.may_be_held(event.view):  # the event's copy does not say whether it is held: asked
            applied = payments.ask_and_apply(sid, source="sweep: unknown money", now=clock()).applied
            assert applied is not None  # without `for_order`, ask_and_apply always applies the answer
        else:
            applied = payments.apply_session(
                event.view, source="sweep: unknown money", now=clock(), refunded_as=refunded_as
            )
    except gateway.ProviderUnavailable:
        raise  # the caller reads the window again next cycle
    except Exception as exc:
        uow.rollback(db.session)
        log.exception("sweep: applying the provider's payment %s failed; the next cycle does not retry it", sid)
        _count(counts, Tally.ERRORS)
        errors.append(
            {
                "pass": PassName.PROVIDER,
                "order_id": None,
                "kind": error_kind(exc),
                "error": f"payment {sid}: {type(exc).__name__}: {exc}"[:500],
            }
        )
        return
    if applied.outcome not in (payments.Outcome.NOOP, payments.Outcome.DUPLICATE):
        _count(counts, applied.outcome)
    log.info("sweep: the provider's payment %s (ref %s): %s", sid, event.view.client_reference_id, applied.outcome)


def _held_sessions(session_ids: list[str]) -> set[str]:
    """Which of these payments are already accounted for: an order paid (or authorized) through
    it, or a refund or unknown-money row for it. One read of each table per chunk of a window,
    not three reads per payment: in steady state every payment of a window is its order's."""
    session = db.session
    taken = (OrderStatus.PAID, OrderStatus.AUTHORIZED)
    held: set[str | None] = set()
    for start in range(0, len(session_ids), HELD_CHUNK):
        chunk = session_ids[start : start + HELD_CHUNK]
        held.update(
            session.scalars(
                select(Order.payment_session_id).where(Order.payment_session_id.in_(chunk), Order.status.in_(taken))
            )
        )
        held.update(session.scalars(select(Refund.session_id).where(Refund.session_id.in_(chunk))))
        held.update(session.scalars(select(UnknownPayment.session_id).where(UnknownPayment.session_id.in_(chunk))))
    session.rollback()
    return {sid for sid in held if sid is not None}
