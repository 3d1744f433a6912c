"""The order store: the one owner of the `orders` row (and its lines).

Everything that writes an order goes through here, with three verbs:

* `read` an order for a decision: an `LoadedOrder`, the domain's rules (`OrderRules`) on a plain
  dataclass, detached from the session, so a caller can call the provider with no transaction
  open and decide later on what it saw;
* `save` a transition: the version-guarded UPDATE (`WHERE id AND version = seen AND status IN
  <the transition's allowed from-states>`, version + 1) plus its events to the outbox, in the
  caller's transaction. A lost race is refused the same way for every transition: `LostRace`
  (a `StaleDataError`, like the ORM's own version check), raised so that the transaction rolls
  back; a use case that tries again after one does so through `retry_on_lost_race`;
* `note` bookkeeping that is not a state change (`payment_processing_at`, `late_money_watch_since`,
  `provider_next_check_at`): no version bump, `updated_at` untouched, so a transition never loses
  a race to it and the order's age (what the sweep selects by) does not move.

Every statement is built once with bound parameters (order_statements.py) and executed on the
table (Python CPU, not the database, is the ceiling on the hot paths); `STATEMENTS` there names
them all, for the statement-cache test. Commits stay with the caller, through `outbox.uow.transaction()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from sqlalchemy import select, update
from sqlalchemy.orm import joinedload, selectinload
from sqlalchemy.orm.exc import StaleDataError

from .. import logs
from ..domain.deadlines import utcnow
from ..domain.order import OrderStatus, Transition
from ..extensions import db
from ..models import Order
from ..outbox.tables import rows_matched
from ..outbox.writer import write_events
from .loaded_order import Line, LoadedOrder  # noqa: F401  (Line: part of the store's vocabulary)
from .order_statements import COUNT_RESTOCKED, INSERT_LINES, INSERT_ORDER, NOTES, PAYMENT_READ, TRANSITIONS, Note


class LostRace(StaleDataError):
    """A transition's guarded UPDATE missed: the order is no longer at the version seen (or no
    longer in a state the transition leaves from). Raised inside the caller's transaction so it
    rolls back; the same for every transition, and a StaleDataError like the ORM's own check."""

    def __init__(self, order: LoadedOrder, transition: Transition):
        super().__init__(
            f"order {order.reference} changed while it was being saved ({transition} from version {order.version})"
        )
        self.order_id = order.id
        self.transition = transition


_Result = TypeVar("_Result")


def retry_on_lost_race(
    attempts: int, attempt: Callable[[int], _Result], *, also: tuple[type[Exception], ...] = ()
) -> _Result:
    """A use case's answer after at most `attempts` tries of `attempt(n)` (n counts from 0), each
    of which reads fresh state and tries once: a try that loses the race (LostRace, or one of the
    exceptions in `also`), which has rolled its transaction back, is followed by another; what the
    last try raises reaches the caller. A try after the first must read what the winner wrote (the
    first may use what the caller has just read)."""
    if attempts < 1:
        raise ValueError(f"retry_on_lost_race needs at least one attempt, not {attempts}")
    retried = (LostRace, *also)
    for n in range(attempts - 1):
        try:
            return attempt(n)
        except retried:
            continue
    return attempt(attempts - 1)


# -- reads ---------------------------------------------------------------------------------------

# Wider than what new_reference() makes, so an order created any other way is still found; narrow
# enough that text which cannot be a reference never reaches the database (PostgreSQL answers a
# NUL byte in a text parameter with an error, which would turn a typo into a 500).
_REFERENCE = re.compile(r"[A-Za-z0-9_-]{1,20}")


def usable_id(order_id) -> bool:
    """An id the column can hold: beyond the 32-bit key PostgreSQL refuses the lookup ("integer out
    of range"), which would fail a request instead of finding no order."""
    return isinstance(order_id, int) and 0 < order_id < 2**31


def read(order_id: int, *, lines: bool = False, fresh: bool = False) -> LoadedOrder | None:
    """The order for a decision, or None. A plain get of the row (no SQL when this transaction has
    already loaded it; `fresh` re-reads it), `lines` loads its lines too. The caller decides
    whether a transaction stays open afterwards."""
    row = db.session.get(Order, order_id, populate_existing=fresh) if usable_id(order_id) else None
    return None if row is None else _known(LoadedOrder.of(row, lines=lines))


def _known(order: LoadedOrder) -> LoadedOrder:
    """The order read for a decision names the lines logged from here on in this request or run
    (shop.logs: `order_ref`, `order_id`)."""
    logs.learn(order_ref=order.reference, order_id=order.id)
    return order


def by_reference(reference: str | None, *, details: bool = False) -> Order | None:
    """The mapped order named by text from outside (a URL, a form, a provider's event), for display;
    with `details`, its lines and refunds read in the same statement (an order's page shows both:
    one query, not three)."""
    if not reference or not _REFERENCE.fullmatch(reference):
        return None
    query = select(Order).where(Order.reference == reference)
    if details:
        query = query.options(joinedload(Order.lines), joinedload(Order.refunds))
    return db.session.execute(query).unique().scalar_one_or_none()


_NEWEST_FIRST = (Order.created_at.desc(), Order.id.desc())


def of_browser(browser_id: str) -> list[Order]:
    """The mapped orders a browser placed, newest first, for display: with their lines and refunds
    (one query each for all of them, not one per order)."""
    query = select(Order).where(Order.browser_id == browser_id).order_by(*_NEWEST_FIRST)
    return list(db.session.execute(query.options(selectinload(Order.lines), selectinload(Order.refunds))).scalars())


def summaries_of_browser(browser_id: str):
    """What the list's JSON gives of each order a browser placed, newest first: its reference,
    status, total, currency and time, in one statement of those columns (no mapped order to build)."""
    columns = (Order.reference, Order.status, Order.total, Order.currency, Order.created_at)
    return db.session.execute(select(*columns).where(Order.browser_id == browser_id).order_by(*_NEWEST_FIRST)).all()


def read_by_reference(reference: str | None) -> LoadedOrder | None:
    row = by_reference(reference)
    return None if row is None else _known(LoadedOrder.of(row))


def read_for_payment(order_id: int) -> LoadedOrder | None:
    """The usual payment notice's read, on the table (no mapped object to build)."""
    row = db.session.execute(PAYMENT_READ, {"order": order_id}).first()
    return None if row is None else _known(LoadedOrder(**row._mapping))


def current_state(order_id: int):
    """(status, payment_session_id) as committed now, or None: what a lost race lost to."""
    return db.session.execute(select(Order.status, Order.payment_session_id).where(Order.id == order_id)).first()


# -- new orders ----------------------------------------------------------------------------------


def insert_order(
    session,
    *,
    reference: str,
    access_token: str,
    browser_id: str,
    email: str,
    total: int,
    currency: str,
    now: datetime,
    lines: list[dict],
    in_line: bool = False,
    ships: bool = False,
    client_address: str | None = None,
) -> int:
    """A new order (PendingPayment, version 1) and its lines, in the caller's transaction; its id.
    `lines` are dicts of variant_id, sku, name, quantity and unit_price; each gets the order's id.
    `in_line`: the order waits in line for its payment page from the start (`payment_queued_at`)."""
    order_id = session.execute(
        INSERT_ORDER,
        dict(
            reference=reference,
            access_token=access_token,
            browser_id=browser_id,
            email=email,
            status=OrderStatus.PENDING_PAYMENT,
            total=total,
            currency=currency,
            inventory_restored=False,
            payment_attempts=0,
            version=1,
            created_at=now,
            updated_at=now,
            payment_queued_at=now if in_line else None,
            ships=ships,
            client_address=client_address,
        ),
    ).scalar_one()
    for line in lines:
        line["order_id"] = order_id
    session.execute(INSERT_LINES, lines)
    logs.learn(order_ref=reference, order_id=order_id)
    return order_id


# -- transitions ---------------------------------------------------------------------------------


def save(
    order: LoadedOrder,
    transition: Transition,
    events=(),
    *,
    now: datetime | None = None,
    watch_from: datetime | None = None,
) -> None:
    """Write the transition the snapshot has just made, guarded by the version it was read at, and
    its events to the outbox, in the caller's transaction. Raises LostRace when the order moved
    meanwhile; on success the snapshot is at the new version. `events`: the transition's own, as
    its `Ok` returned them. `now`, the write's time (the clock's when None), is its events' time,
    and a cancel's `cancelled_at`."""
    statement, columns = TRANSITIONS[transition]
    session = db.session
    now = now if now is not None else utcnow()
    params = {"order": order.id, "seen": order.version, "now": now, "watch_from": watch_from}
    params.update((f"v_{c}", getattr(order, c)) for c in columns)
    if rows_matched(session.execute(statement, params)) != 1:
        raise LostRace(order, transition)
    _forget_loaded(session, order.id)
    order.version += 1
    if events:
        write_events(session, list(events), now)


def _forget_loaded(session, order_id: int) -> None:
    """A mapped Order this session loaded is stale once the table moved under it: expire it, so
    the next look reads the row (no SQL now)."""
    identity_map = session.identity_map
    if not identity_map:  # the hot paths load no mapped object: nothing to look up
        return
    loaded = identity_map.get(session.identity_key(Order, order_id))
    if loaded is not None:
        session.expire(loaded)


# -- bookkeeping ---------------------------------------------------------------------------------


def note(order_id: int, what: Note, at: datetime | None = None, **values) -> None:
    """Bookkeeping on the row, in the caller's transaction: not a state change, so no version bump
    (a transition must not lose a race to it) and updated_at unchanged. `values`: the note's own
    parameters (DECLINED: `attempt` and `words`; see note_declined)."""
    db.session.execute(NOTES[what], {"order": order_id, "at": at, "attempt": None, "words": None, **values})
    _forget_loaded(db.session, order_id)


def note_capture(order_id: int, at: datetime) -> bool:
    """A ship asked for the capture of the Authorized order's hold (CAPTURE): False when one was
    asked already, or the order is no longer Authorized. In the caller's transaction."""
    result = db.session.execute(NOTES[Note.CAPTURE], {"order": order_id, "at": at, "attempt": None, "words": None})
    _forget_loaded(db.session, order_id)
    return rows_matched(result) == 1


def note_capture_refused(order_id: int) -> bool:
    """The provider refused the capture a ship asked for, and the hold stands (CAPTURE_REFUSED):
    the ask is withdrawn. False when the order is no longer Authorized and being captured."""
    result = db.session.execute(NOTES[Note.CAPTURE_REFUSED], {"order": order_id})
    _forget_loaded(db.session, order_id)
    return rows_matched(result) == 1


def note_declined(order_id: int, attempt: int, words: str, at: datetime) -> bool:
    """A card was declined on the payment page of the order's attempt `attempt`: its words and
    when, on the row (DECLINED), in the caller's transaction. False when the order is no longer
    waiting at that attempt's page (paid, cancelled, or a newer attempt): old news then."""
    result = db.session.execute(NOTES[Note.DECLINED], {"order": order_id, "at": at, "attempt": attempt, "words": words})
    _forget_loaded(db.session, order_id)
    return rows_matched(result) == 1


def change_email(order_id: int, email: str) -> str | None:
    """The order's address replaced (an operator's correction), in the caller's transaction: not a
    state change, so no version bump. The address it had, or None when there is no such order."""
    session = db.session
    old = session.execute(select(Order.email).where(Order.id == order_id).with_for_update()).scalar_one_or_none()
    if old is None:
        return None
    session.execute(update(Order).where(Order.id == order_id).values(email=email))
    _forget_loaded(session, order_id)
    return old


def count_restocked(order_id: int, line_id: int, units: int) -> bool:
    """Count `units` of the order's line as put back by a refund; False (nothing counted) when
    that would pass what the line bought. Bookkeeping beside the order's lock, no version bump."""
    return rows_matched(db.session.execute(COUNT_RESTOCKED, {"line": line_id, "order": order_id, "units": units})) == 1
