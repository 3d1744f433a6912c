"""The order store's statements (docs/ARCHITECTURE.md, The order store), each built once with
bound parameters and executed on the table by shop.store.order_store, the one module that runs them:
its reads, the insert of a new order, each transition's version-guarded UPDATE and the bookkeeping
notes. `STATEMENTS` names them all, for the statement-cache test."""

from __future__ import annotations

import re
from enum import StrEnum

from sqlalchemy import Update, bindparam, func, insert, literal_column, select, update

from ..domain.order import ALLOWED, UNPAID, OrderStatus, Transition
from ..models import InventoryItem, Order, OrderLine
from ..outbox.tables import table_of

S, T = OrderStatus, Transition
_orders, _lines, _inventory = table_of(Order), table_of(OrderLine), table_of(InventoryItem)

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
        # What no operator's refund put back already (saga.line_restock): a restore gives the rest.
        (_lines.c.quantity - _lines.c.restocked).label("quantity"),
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


# -- new orders ----------------------------------------------------------------------------------

INSERT_ORDER = insert(_orders).returning(_orders.c.id)
INSERT_LINES = insert(_lines)

# An operator's refund puts units of a line back (saga.line_restock): counted only while the
# line's count stays within what was bought, so no unit is given back twice.
COUNT_RESTOCKED = (
    update(_lines)
    .where(
        _lines.c.id == bindparam("line"),
        _lines.c.order_id == bindparam("order"),
        _lines.c.restocked + bindparam("units") <= _lines.c.quantity,
    )
    .values(restocked=_lines.c.restocked + bindparam("units"))
)


# -- transitions ---------------------------------------------------------------------------------


def _guarded(transition: Transition) -> Update:
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


def _writes(transition: Transition, bound: tuple[str, ...], **fixed):
    """The transition's statement, writing each snapshot attribute in `bound` (as v_<column>) and
    the `fixed` values, with the attributes it binds."""
    return _guarded(transition).values(**{column: _v(column) for column in bound}, **fixed), bound


# Each transition's statement and the snapshot attributes it writes (bound as v_<column>).
# updated_at: the row's onupdate (the time of the write) unless the statement binds `now`.
_PAID = ("status", "payment_session_id", "shipping_details", "tax", "charged")
# What a payment that went through (paid or held) also writes: nothing is settling or declined any
# more, and the order's age counts from the payment (`now`).
_PAID_CLEARS = {"payment_processing_at": None, "payment_declined_at": None, "updated_at": _NOW}
TRANSITIONS = {
    T.START_PAYMENT: _writes(
        T.START_PAYMENT,
        ("status", "payment_session_id", "payment_session_url", "payment_attempts", "payment_session_expires_at"),
        payment_processing_at=None,
        payment_queued_at=None,
        payment_declined_at=None,
    ),
    T.MARK_PAID: _writes(T.MARK_PAID, _PAID, **_PAID_CLEARS),
    # The provider holds the money until the order ships (CAPTURE_MODE=dispatch).
    T.MARK_AUTHORIZED: _writes(T.MARK_AUTHORIZED, (*_PAID, "hold_expires_at"), **_PAID_CLEARS),
    # Money that is real for an order that had not started (or had failed) its payment: the session
    # is adopted and paid in one transition.
    T.ADOPT_AND_PAY: _writes(T.ADOPT_AND_PAY, (*_PAID, "payment_session_url"), payment_queued_at=None, **_PAID_CLEARS),
    # The same for money the provider holds (CAPTURE_MODE=dispatch): adopted and authorized.
    T.ADOPT_AND_AUTHORIZE: _writes(
        T.ADOPT_AND_AUTHORIZE,
        (*_PAID, "payment_session_url", "hold_expires_at"),
        payment_queued_at=None,
        **_PAID_CLEARS,
    ),
    T.MARK_PAYMENT_FAILED: _writes(T.MARK_PAYMENT_FAILED, ("status", "last_payment_error"), payment_processing_at=None),
    # `watch_from` starts the sweep's late-money watch of the order (None: only if an async payment
    # was settling, which then becomes the watch, since when it settled). Why and when it was
    # cancelled go on the row with it: the reason its OrderCancelled event carries, at that event's
    # time (`now`), so the order's pages read the row and never the events.
    T.CANCEL: _writes(
        T.CANCEL,
        ("status", "cancel_reason"),
        cancelled_at=bindparam("now", type_=_orders.c.cancelled_at.type),
        payment_queued_at=None,
        payment_processing_at=None,
        late_money_watch_since=func.coalesce(
            _orders.c.late_money_watch_since,
            _orders.c.payment_processing_at,
            bindparam("watch_from", type_=_orders.c.late_money_watch_since.type),
        ),
    ),
    # A cancel saved by an older release (an old web still serving during an upgrade's roll) left
    # why and when empty: the compensation of its OrderCancelled fills them in, the reason from the
    # event and the time from the cancel's own write (the row's updated_at before this one).
    T.MARK_INVENTORY_RESTORED: (
        _guarded(T.MARK_INVENTORY_RESTORED).values(
            inventory_restored=True,
            updated_at=_NOW,
            cancel_reason=func.coalesce(_orders.c.cancel_reason, _v("cancel_reason")),
            cancelled_at=func.coalesce(_orders.c.cancelled_at, _orders.c.updated_at),
        ),
        ("cancel_reason",),
    ),
    # Not a state change a paid order's age counts from: updated_at stays.
    T.RESTOCK_PAID: (
        _guarded(T.RESTOCK_PAID).values(inventory_restored=True, updated_at=_orders.c.updated_at),
        (),
    ),
    # The order's fulfilment, once (the snapshot's rule refuses a second): when and the tracking
    # number. Not a payment change: updated_at stays the time of the payment (the receipt's).
    T.SHIP: _writes(T.SHIP, ("shipped_at", "tracking"), updated_at=_orders.c.updated_at),
}


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
    CAPTURE = "capture"
    CAPTURE_REFUSED = "capture_refused"


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
    # A ship asked for the capture of an Authorized order's hold: once (the first ask wins). It
    # moves the version: a cancel that read the order before it must lose its race, or it could
    # save Cancelled over a hold the capture has just taken (model/saga.pml).
    Note.CAPTURE: update(_orders)
    .where(
        _orders.c.id == bindparam("order"),
        _orders.c.status == literal_column(f"'{S.AUTHORIZED.value}'"),
        _orders.c.capture_requested_at.is_(None),
    )
    .values(
        capture_requested_at=bindparam("at", type_=_orders.c.capture_requested_at.type),
        version=_orders.c.version + 1,
        **_KEEP_AGE,
    ),
    # The provider refused that capture, the hold still standing: the order is no longer being
    # shipped, so it can be shipped again or cancelled. It moves the version, as the ask did.
    Note.CAPTURE_REFUSED: update(_orders)
    .where(
        _orders.c.id == bindparam("order"),
        _orders.c.status == literal_column(f"'{S.AUTHORIZED.value}'"),
        _orders.c.capture_requested_at.is_not(None),
    )
    .values(capture_requested_at=None, version=_orders.c.version + 1, **_KEEP_AGE),
    # The sweep leaves the order out of its provider pass until then.
    Note.NEXT_CHECK: update(_orders)
    .where(_orders.c.id == bindparam("order"))
    .values(provider_next_check_at=bindparam("at", type_=_orders.c.provider_next_check_at.type), **_KEEP_AGE),
}


STATEMENTS = {
    "orders: read for a payment": PAYMENT_READ,
    "orders: read for a restore": RESTORE_READ,
    "orders: insert": INSERT_ORDER,
    "orders: insert lines": INSERT_LINES,
    "orders: count a line's restocked units": COUNT_RESTOCKED,
    **{f"orders: {name}": statement for name, (statement, _) in TRANSITIONS.items()},
    **{f"orders: note {name}": statement for name, statement in NOTES.items()},
}
