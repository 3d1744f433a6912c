"""The order store: the one owner of the `orders` row (and its lines).

Everything that writes an order goes through here, with three verbs:

* `read` an order for a decision: an `LoadedOrder`, the domain's rules (`OrderRules`) on a plain
  dataclass, detached from the session, so a caller can call the provider with no transaction
  open and decide later on what it saw;
* `save` a transition: the version-guarded UPDATE (`WHERE id AND version = seen AND status IN
  <the transition's allowed from-states>`, version + 1) plus its events to the outbox, in the
  caller's transaction. A lost race is refused the same way for every transition: `LostRace`
  (a `StaleDataError`, like the ORM's own version check), raised so that the transaction rolls
  back;
* `note` bookkeeping that is not a state change (`payment_processing_at`, `late_money_watch_since`,
  `provider_next_check_at`): no version bump, `updated_at` untouched, so a transition never loses
  a race to it and the order's age (what the sweep selects by) does not move.

Every statement is built once with bound parameters and executed on the table (Python CPU, not
the database, is the ceiling on the hot paths); `STATEMENTS` names them all, for the
statement-cache test. Commits stay with the caller, through `outbox.uow.transaction()`.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from sqlalchemy import bindparam, func, insert, literal_column, select, update
from sqlalchemy.orm.exc import StaleDataError

from .. import logs
from ..domain.order import ALLOWED, UNPAID, OrderStatus, Transition
from ..extensions import db
from ..models import InventoryItem, Order, OrderLine
from ..outbox.writer import write_events
from .loaded_order import Line, LoadedOrder  # noqa: F401  (Line: part of the store's vocabulary)

S, T = OrderStatus, Transition
_orders, _lines, _inventory = Order.__table__, OrderLine.__table__, InventoryItem.__table__


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


# -- reads ---------------------------------------------------------------------------------------

# The usual payment notice's read: the order's state at its version, nothing more.
PAYMENT_READ = select(
    _orders.c.id,
    _orders.c.reference,
    _orders.c.status,
    _orders.c.version,
    _orders.c.total,
    _orders.c.currency,
    _orders.c.payment_session_id,
    _orders.c.inventory_restored,
).where(_orders.c.id == bindparam("order"))
# The compensation's read: the order's state, its lines and their inventory rows, in one consistent
# read. Soft-deleted inventory rows included on purpose: a retired variant's stock still belongs to it.
RESTORE_READ = (
    select(
        _orders.c.reference,
        _orders.c.status,
        _orders.c.inventory_restored,
        _orders.c.version,
        _lines.c.variant_id,
        _lines.c.quantity,
        _inventory.c.on_hand,
    )
    .select_from(
        _orders.outerjoin(_lines, _lines.c.order_id == _orders.c.id).outerjoin(
            _inventory, _inventory.c.variant_id == _lines.c.variant_id
        )
    )
    .where(_orders.c.id == bindparam("order_id"))
    .order_by(_lines.c.id)
)

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


def by_reference(reference: str | None) -> Order | None:
    """The mapped order named by text from outside (a URL, a form, a provider's event), for display."""
    if not reference or not _REFERENCE.fullmatch(reference):
        return None
    return db.session.execute(select(Order).where(Order.reference == reference)).scalar_one_or_none()


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

INSERT_ORDER = insert(_orders).returning(_orders.c.id)
INSERT_LINES = insert(_lines)


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
            status=S.PENDING_PAYMENT,
            total=total,
            currency=currency,
            inventory_restored=False,
            payment_attempts=0,
            version=1,
            created_at=now,
            updated_at=now,
            payment_queued_at=now if in_line else None,
            ships=ships,
        ),
    ).scalar_one()
    for line in lines:
        line["order_id"] = order_id
    session.execute(INSERT_LINES, lines)
    logs.learn(order_ref=reference, order_id=order_id)
    return order_id


# -- transitions ---------------------------------------------------------------------------------


def _guarded(transition: Transition) -> update:
    """UPDATE orders ... WHERE id = :order AND version = :seen AND status IN (<from_states>), bumping
    the version: what an ORM flush of the versioned row checks, plus the transition's own rule.

    The states are written into the SQL, not bound: a list bound to IN is an "expanding"
    parameter, which SQLAlchemy re-renders into the statement's text on every execution (a regex
    pass over the SQL, on the hottest handler). They are the domain's own constant names."""
    states = sorted(s.value for s in ALLOWED[transition])
    assert all(_STATE_NAME.fullmatch(s) for s in states), states
    return (
        update(_orders)
        .where(
            _orders.c.id == bindparam("order"),
            _orders.c.version == bindparam("seen"),
            _orders.c.status.in_([literal_column(f"'{s}'") for s in states]),
        )
        .values(version=_orders.c.version + 1)
    )


_STATE_NAME = re.compile(r"[A-Za-z]+")


def _v(column: str):
    return bindparam(f"v_{column}", type_=_orders.c[column].type)


_NOW = bindparam("now", type_=_orders.c.updated_at.type)

# Each transition's statement and the snapshot attributes it writes (bound as v_<column>).
# updated_at: the row's onupdate (the time of the write) unless the statement binds `now`.
TRANSITIONS = {
    T.START_PAYMENT: (
        _guarded(T.START_PAYMENT).values(
            status=_v("status"),
            payment_session_id=_v("payment_session_id"),
            payment_session_url=_v("payment_session_url"),
            payment_attempts=_v("payment_attempts"),
            payment_session_expires_at=_v("payment_session_expires_at"),
            payment_processing_at=None,
            payment_queued_at=None,
            payment_declined_at=None,
        ),
        ("status", "payment_session_id", "payment_session_url", "payment_attempts", "payment_session_expires_at"),
    ),
    T.MARK_PAID: (
        _guarded(T.MARK_PAID).values(
            status=_v("status"),
            payment_session_id=_v("payment_session_id"),
            payment_processing_at=None,
            payment_declined_at=None,
            shipping_details=_v("shipping_details"),
            updated_at=_NOW,
        ),
        ("status", "payment_session_id", "shipping_details"),
    ),
    # Money that is real for an order that had not started (or had failed) its payment: the session
    # is adopted and paid in one transition.
    T.ADOPT_AND_PAY: (
        _guarded(T.ADOPT_AND_PAY).values(
            status=_v("status"),
            payment_session_id=_v("payment_session_id"),
            payment_session_url=_v("payment_session_url"),
            payment_processing_at=None,
            payment_queued_at=None,
            payment_declined_at=None,
            shipping_details=_v("shipping_details"),
            updated_at=_NOW,
        ),
        ("status", "payment_session_id", "payment_session_url", "shipping_details"),
    ),
    T.MARK_PAYMENT_FAILED: (
        _guarded(T.MARK_PAYMENT_FAILED).values(
            status=_v("status"), last_payment_error=_v("last_payment_error"), payment_processing_at=None
        ),
        ("status", "last_payment_error"),
    ),
    # `watch_from` starts the sweep's late-money watch of the order (None: only if an async payment
    # was settling, which then becomes the watch, since when it settled).
    T.CANCEL: (
        _guarded(T.CANCEL).values(
            status=_v("status"),
            payment_queued_at=None,
            payment_processing_at=None,
            late_money_watch_since=func.coalesce(
                _orders.c.late_money_watch_since,
                _orders.c.payment_processing_at,
                bindparam("watch_from", type_=_orders.c.late_money_watch_since.type),
            ),
        ),
        ("status",),
    ),
    T.MARK_INVENTORY_RESTORED: (
        _guarded(T.MARK_INVENTORY_RESTORED).values(inventory_restored=True, updated_at=_NOW),
        (),
    ),
    # Not a state change a paid order's age counts from: updated_at stays.
    T.RESTOCK_PAID: (
        _guarded(T.RESTOCK_PAID).values(inventory_restored=True, updated_at=_orders.c.updated_at),
        (),
    ),
}


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
    meanwhile; on success the snapshot is at the new version and its recorded events are spent."""
    statement, columns = TRANSITIONS[transition]
    session = db.session
    params = {"order": order.id, "seen": order.version, "now": now, "watch_from": watch_from}
    params.update((f"v_{c}", getattr(order, c)) for c in columns)
    if session.execute(statement, params).rowcount != 1:
        raise LostRace(order, transition)
    _forget_loaded(session, order.id)
    order.version += 1
    order.pending_events.clear()
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

_KEEP_AGE = {"updated_at": _orders.c.updated_at}  # no onupdate: the order's age is not bookkeeping's


class Note(StrEnum):
    """Bookkeeping the store can write on an order's row (see NOTES)."""

    PROCESSING = "processing"
    WATCH = "watch"
    STOP_WATCHING = "stop_watching"
    QUEUE = "queue"
    LEAVE_QUEUE = "leave_queue"
    NEXT_CHECK = "next_check"
    DECLINED = "declined"


NOTES = {
    # A live order's async payment is settling (see Order.payment_processing_at).
    Note.PROCESSING: update(_orders)
    .where(_orders.c.id == bindparam("order"))
    .values(payment_processing_at=bindparam("at", type_=_orders.c.payment_processing_at.type), **_KEEP_AGE),
    # Money may still come for a cancelled order's session: the sweep watches it (see
    # Order.late_money_watch_since); an order already watched keeps its start.
    Note.WATCH: update(_orders)
    .where(_orders.c.id == bindparam("order"))
    .values(
        late_money_watch_since=func.coalesce(
            _orders.c.late_money_watch_since, bindparam("at", type_=_orders.c.late_money_watch_since.type)
        ),
        **_KEEP_AGE,
    ),
    # No more money can come for the session: the sweep stops watching it.
    Note.STOP_WATCHING: update(_orders)
    .where(_orders.c.id == bindparam("order"))
    .values(late_money_watch_since=None, provider_next_check_at=None, **_KEEP_AGE),
    # In line for the payment page (see Order.payment_queued_at): an order already in line keeps
    # its place; only an unpaid order can join (one that moved on meanwhile is left alone).
    Note.QUEUE: update(_orders)
    .where(
        _orders.c.id == bindparam("order"),
        _orders.c.status.in_([literal_column(f"'{s.value}'") for s in sorted(UNPAID)]),
    )
    .values(
        payment_queued_at=func.coalesce(
            _orders.c.payment_queued_at, bindparam("at", type_=_orders.c.payment_queued_at.type)
        ),
        **_KEEP_AGE,
    ),
    # Out of the line without a session (the provider refused to start this payment).
    Note.LEAVE_QUEUE: update(_orders)
    .where(_orders.c.id == bindparam("order"))
    .values(payment_queued_at=None, **_KEEP_AGE),
    # A card was declined on the order's payment page, which stays open for another try: only an
    # order still waiting at that very attempt's page (see Order.payment_declined_at).
    Note.DECLINED: update(_orders)
    .where(
        _orders.c.id == bindparam("order"),
        _orders.c.status == literal_column(f"'{S.PAYMENT_INITIATED.value}'"),
        _orders.c.payment_attempts == bindparam("attempt"),
    )
    .values(
        payment_declined_at=bindparam("at", type_=_orders.c.payment_declined_at.type),
        last_payment_error=bindparam("words", type_=_orders.c.last_payment_error.type),
        **_KEEP_AGE,
    ),
    # The sweep leaves the order out of its provider pass until then.
    Note.NEXT_CHECK: update(_orders)
    .where(_orders.c.id == bindparam("order"))
    .values(provider_next_check_at=bindparam("at", type_=_orders.c.provider_next_check_at.type), **_KEEP_AGE),
}


def note(order_id: int, what: Note, at: datetime | None = None, **values) -> None:
    """Bookkeeping on the row, in the caller's transaction: not a state change, so no version bump
    (a transition must not lose a race to it) and updated_at unchanged. `values`: the note's own
    parameters (DECLINED: `attempt` and `words`; see note_declined)."""
    db.session.execute(NOTES[what], {"order": order_id, "at": at, "attempt": None, "words": None, **values})
    _forget_loaded(db.session, order_id)


def note_declined(order_id: int, attempt: int, words: str, at: datetime) -> bool:
    """A card was declined on the payment page of the order's attempt `attempt`: its words and
    when, on the row (DECLINED), in the caller's transaction. False when the order is no longer
    waiting at that attempt's page (paid, cancelled, or a newer attempt): old news then."""
    result = db.session.execute(NOTES[Note.DECLINED], {"order": order_id, "at": at, "attempt": attempt, "words": words})
    _forget_loaded(db.session, order_id)
    return result.rowcount == 1


STATEMENTS = {
    "orders: read for a payment": PAYMENT_READ,
    "orders: read for a restore": RESTORE_READ,
    "orders: insert": INSERT_ORDER,
    "orders: insert lines": INSERT_LINES,
    **{f"orders: {name}": statement for name, (statement, _) in TRANSITIONS.items()},
    **{f"orders: note {name}": statement for name, statement in NOTES.items()},
}
