"""Payment use cases: start a payment, apply what the provider says about a session (the one
guarded path shared by the webhook, the return page, the sweep and the console), and retire a
session before a cancel."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, NamedTuple

from flask import current_app
from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm.exc import StaleDataError

from ..domain.deadlines import as_utc, session_expires_at, unpaid_deadline, utcnow
from ..domain.order import ALLOWED, CANCELLED_BY_CUSTOMER, PAYMENT_WINDOW_EXPIRED, OrderRules, OrderStatus
from ..domain.payment import check_payment_proof
from ..domain.results import Refused
from ..extensions import db
from ..models import Order, PaymentProofRefusal, ProcessedStripeEvent, ProviderRefusal
from ..orders.lookup import order_by_reference
from ..outbox import uow
from ..outbox.writer import write_events
from . import gateway
from .refunds import record_late_payment

log = logging.getLogger("shop.payments")
S = OrderStatus


@dataclass
class StartOutcome:
    status: str                 # started | unavailable | refused
    url: str | None = None
    message: str = ""


class PaymentLine(NamedTuple):
    sku: str
    name: str
    quantity: int
    unit_price: int


@dataclass
class PayableOrder(OrderRules):
    """What starting a payment needs to know about an order as of `version`: enough to call the
    provider without holding or re-reading the row. Not mapped: the domain's guarded transition
    runs on it, and start_payment writes the result with a conditional UPDATE."""
    id: int
    reference: str
    access_token: str
    email: str
    currency: str
    lines: tuple[PaymentLine, ...]
    last_change: datetime            # updated_at at `version`: the pay-by time counts from it
    version: int
    status: str = S.PENDING_PAYMENT.value
    payment_attempts: int = 0
    payment_session_id: str | None = None
    payment_session_url: str | None = None
    inventory_restored: bool = False

    @classmethod
    def just_placed(cls, placed) -> PayableOrder:
        """An order place_order has just committed: PendingPayment, version 1, no attempt yet."""
        return cls(placed.order_id, placed.reference, placed.access_token, placed.email, placed.currency,
                   tuple(PaymentLine(l["sku"], l["name"], l["quantity"], l["unit_price"]) for l in placed.lines),
                   placed.placed_at, version=1)

    @classmethod
    def of(cls, order: Order) -> PayableOrder:
        return cls(order.id, order.reference, order.access_token, order.email, order.currency,
                   tuple(PaymentLine(l.sku, l.name, l.quantity, l.unit_price) for l in order.lines),
                   order.updated_at, order.version, order.status, order.payment_attempts,
                   order.payment_session_id, order.payment_session_url, order.inventory_restored)


# The PaymentInitiated write: one UPDATE guarded by the version seen and the transition's allowed
# states (what an ORM flush would check), built once, on the table (nothing in the session to
# synchronise). updated_at takes the column's onupdate, as a flush would.
_orders = Order.__table__
_START_PAYMENT = (
    update(_orders)
    .where(_orders.c.id == bindparam("order"), _orders.c.version == bindparam("seen"),
           _orders.c.status.in_([s.value for s in ALLOWED["start_payment"]]))
    .values(status=bindparam("new_status"), payment_session_id=bindparam("session_id"),
            payment_session_url=bindparam("session_url"), payment_attempts=bindparam("attempts"),
            payment_session_expires_at=bindparam("session_expires", type_=_orders.c.payment_session_expires_at.type),
            payment_processing_at=None, version=_orders.c.version + 1)
)


def start_payment(order_id: int, now: datetime | None = None, *, placed=None) -> StartOutcome:
    """PendingPayment / PaymentFailed -> PaymentInitiated with a fresh hosted Checkout Session.

    The provider call happens outside any transaction (no row lock is held across the
    network); the transition then commits only if nobody moved the order meanwhile: one
    UPDATE guarded by the version seen and the transition's allowed states, the same
    `WHERE version = seen` the ORM would issue, plus the PaymentInitiated event, in one commit.

    `placed` (place_order's result, in the same request) says what the order is at version 1,
    so a checkout does not read back what it has just written."""
    now = now or utcnow()
    session = db.session
    if placed is not None:
        order = PayableOrder.just_placed(placed)
    else:
        row = session.get(Order, order_id)
        if row is None:
            session.rollback()
            return StartOutcome("refused", message="No such order.")
        order = PayableOrder.of(row)
        session.rollback()  # no transaction open across the provider call
    if not order.can("start_payment"):
        return StartOutcome("refused", message=f"This order is {order.status}; it cannot be paid now.")
    cfg = current_app.config
    base = cfg["PUBLIC_BASE_URL"]
    pay_by = unpaid_deadline(order.last_change, cfg["UNPAID_ORDER_EXPIRY_SECONDS"])
    expires = session_expires_at(pay_by, now, cfg["STRIPE_SESSION_MIN_SECONDS"])
    attempt = order.payment_attempts + 1
    seen_version = order.version
    try:
        view = gateway.create_checkout_session(
            order_id=order.id, reference=order.reference, attempt=attempt, lines=order.lines,
            currency=order.currency, email=order.email, expires_at=expires,
            success_url=f"{base}/checkout/return?order={order.reference}&session_id={{CHECKOUT_SESSION_ID}}",
            cancel_url=f"{base}/orders/{order.reference}?token={order.access_token}",
        )
    except gateway.ProviderUnavailable as exc:
        log.warning("order %s: payment provider unreachable, order stays %s: %s", order.reference, order.status, exc)
        return StartOutcome("unavailable", message="We could not reach the payment provider. Your order is saved "
                                                   "and your items are held; please try “Pay now” again in a moment.")
    except gateway.ProviderRefused as exc:
        log.error("order %s: provider refused the checkout session: %s", order.reference, exc)
        _note_refusal(order.id, attempt, exc)
        return StartOutcome("unavailable", message="We could not start the payment: the payment provider turned "
                                                   "the request down. Nothing was charged, and your order and its "
                                                   "items are held until its payment window closes; our team can "
                                                   "see why. Please try “Pay now” again later or contact us.")
    transition = order.start_payment(view.id, view.url)
    if not transition.ok:  # checked above on the same snapshot; kept so the rule has one home
        _expire_quietly(view.id)
        return StartOutcome("refused", message=transition.message)
    try:
        moved = session.execute(_START_PAYMENT, dict(
            order=order.id, seen=seen_version, new_status=order.status, session_id=order.payment_session_id,
            session_url=order.payment_session_url, attempts=attempt, session_expires=view.expires_at)).rowcount
        if moved != 1:
            current = session.execute(select(Order.status, Order.payment_session_id)
                                      .where(Order.id == order.id)).first()
            uow.rollback(session)
            # A concurrent start of the same attempt (a double click on "Pay now") may have won
            # with the same Idempotency-Key, so the provider handed both the same session: that
            # one is the order's payment page now, not an unused one to expire.
            if current is None or current.payment_session_id != view.id:
                _expire_quietly(view.id)
            elif current.status == S.PAYMENT_INITIATED.value:
                return StartOutcome("started", url=view.url)
            status = current.status if current is not None else "gone"
            return StartOutcome("refused", message=f"This order changed meanwhile (now {status}); please reload it.")
        write_events(session, transition.events)
        uow.commit(session)
    except BaseException:
        uow.rollback(session)
        raise
    uow.publish_after_commit(session)
    return StartOutcome("started", url=view.url)


def _note_refusal(order_id: int, attempt: int, exc: gateway.ProviderRefused) -> None:
    """Keep the provider's reason for the order's console timeline, in its own small commit.
    Bookkeeping only: failing to write it must not change what the customer is told."""
    session = db.session
    try:
        session.add(ProviderRefusal(order_id=order_id, attempt=attempt, code=(exc.code or None) and str(exc.code)[:100],
                                    reason=str(exc)))
        session.commit()
    except Exception:  # noqa: BLE001 - logged; the refusal itself is already in the log above
        session.rollback()
        log.exception("order %s: could not record the provider's refusal", order_id)


def _expire_quietly(session_id: str) -> None:
    try:
        gateway.expire_session(session_id)
    except Exception as exc:
        log.warning("could not expire unused session %s: %s", session_id, exc)


def retire_session_before_cancel(order_id: int, reference: str, sid: str) -> Refused | bool:
    """Read the session's status; paid -> refuse the cancel (the payment stands). Otherwise
    expire it; if the expire fails, read again and refuse if it is now paid. Anything else
    (already expired, gone, provider down) is a warning and the cancellation proceeds.

    Called outside any transaction. True says the session could still take money (an async
    payment settling, or a session that could not be read or expired): the cancel marks the
    order so the sweep watches it (`sweep.watch_cancelled_payments`) and a lost late-payment
    webhook cannot leave the money kept."""
    paid = Refused("payment_already_completed",
                   "This order has already been paid, so it can no longer be cancelled. "
                   "Contact us if you want a refund.")
    try:
        view = gateway.retrieve_session(sid)
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        log.warning("cancel of order %s: could not read session %s (%s); cancelling anyway", reference, sid, exc)
        return True
    if view.payment_status == "paid":
        return paid
    if view.status != "open":
        if view.status == "complete":
            log.warning("cancel of order %s: session %s awaits an async payment; a late success will be refunded",
                        reference, sid)
            return True
        return False
    try:
        gateway.expire_session(sid, cancelling_order=order_id)
        return False
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        try:
            again = gateway.retrieve_session(sid)
        except (gateway.ProviderUnavailable, gateway.ProviderRefused):
            again = None
        if again is not None and again.payment_status == "paid":
            return paid
        log.warning("cancel of order %s: could not expire session %s (%s); cancelling anyway", reference, sid, exc)
        return True


@dataclass
class Applied:
    outcome: str          # paid | payment_failed | refund_created | already_refunded | noop | duplicate |
                          # unknown_order | proof_refused | awaiting_async
    order: Order | _PaymentSnapshot | None = None  # a snapshot when the usual-payment path applied it
    detail: str = ""


def find_order(view: gateway.SessionView) -> Order | None:
    # The row only, which is all a plain get loads (Order's lines and refunds are lazy); no loader
    # options, with which each get builds a cache key.
    # metadata.order_id is the sender's text: beyond the 32-bit key PostgreSQL refuses the lookup
    # ("integer out of range"), which would fail the notice instead of finding no order.
    if view.order_id is not None and 0 < view.order_id < 2**31:
        order = db.session.get(Order, view.order_id)
        if order is not None:
            return order
    if view.client_reference_id:
        return order_by_reference(view.client_reference_id)
    return None


def apply_session(view: gateway.SessionView, *, source: str, failed: bool = False, event_id: str | None = None,
                  now: datetime | None = None, before_commit: Callable[[Applied], None] | None = None,
                  expired_by_cancel: bool = False) -> Applied:
    """Apply the provider's facts about one session to its order, in one transaction, through
    the guarded transitions. `failed` says the provider reported the (async) payment failed;
    `expired_by_cancel` that the session's expiry was a customer's cancel retiring it.
    Idempotent: a repeat finds the order already moved and does nothing. Retries itself on a
    version conflict, because the other writer may have made this notice a no-op.

    `before_commit(result)`, when given, runs inside that same transaction just before it
    commits, on every path that returns (duplicates included): the webhook writes its receipt
    there, so a delivery costs one commit. Anything raised rolls the whole attempt back."""
    now = now or utcnow()
    for attempt in range(4):
        try:
            result = _apply_once(view, source=source, failed=failed, event_id=event_id, now=now,
                                 expired_by_cancel=expired_by_cancel)
            if before_commit is not None:
                before_commit(result)
            uow.commit(db.session)
        except (IntegrityError, StaleDataError):
            # Another writer got there first (moved the order, or claimed the event where the
            # dialect has no ON CONFLICT): the next attempt sees what it did, which may make
            # this notice a duplicate or a no-op.
            uow.rollback(db.session)
            if attempt == 3:
                raise
            continue
        except Exception:
            uow.rollback(db.session)  # forget the recorded events too, or a later commit would write them
            raise
        uow.publish_after_commit(db.session)
        return result
    raise AssertionError("unreachable")


def _claim_event(session, event_id: str, now: datetime) -> bool:
    """Insert the event's dedup row in the caller's transaction; False when it is already there.

    One statement instead of a SELECT then an INSERT: `ON CONFLICT DO NOTHING` on PostgreSQL and
    SQLite (a concurrent first delivery holding the same key makes PostgreSQL wait for its
    outcome, so exactly one of them applies the event), a SAVEPOINT around a plain INSERT
    elsewhere."""
    values = {"event_id": event_id, "processed_at": now}
    claim = _claim_statement(session.get_bind().dialect.name)
    if claim is not None:
        return session.execute(claim, values).first() is not None
    try:
        with session.begin_nested():
            session.execute(insert(ProcessedStripeEvent.__table__), values)
    except IntegrityError:
        return False
    return True


_CLAIMS: dict = {}


def _claim_statement(dialect: str):
    """Built once per dialect and executed with parameters: building the statement on every
    delivery cost about as much CPU as running it. RETURNING says whether a row went in
    (SQLAlchemy does not keep an INSERT's rowcount; psycopg's reads -1)."""
    if dialect not in _CLAIMS:
        upsert = {"postgresql": postgresql_insert, "sqlite": sqlite_insert}.get(dialect)
        table = ProcessedStripeEvent.__table__
        _CLAIMS[dialect] = upsert and upsert(table).on_conflict_do_nothing(index_elements=["event_id"]) \
            .returning(table.c.event_id)
    return _CLAIMS[dialect]


@dataclass
class _PaymentSnapshot(OrderRules):
    """What the usual payment notice needs of an order: its state at `version`. Not mapped: the
    domain's guarded transition runs on it and `_MARK_PAID` writes the result."""

    id: int
    reference: str
    status: str
    total: int
    currency: str
    version: int
    payment_session_id: str | None
    inventory_restored: bool


_PAYMENT_READ = select(_orders.c.id, _orders.c.reference, _orders.c.status, _orders.c.total, _orders.c.currency,
                       _orders.c.version, _orders.c.payment_session_id, _orders.c.inventory_restored) \
    .where(_orders.c.id == bindparam("order"))
_MARK_PAID = (
    update(_orders)
    .where(_orders.c.id == bindparam("order"), _orders.c.version == bindparam("seen"),
           _orders.c.status.in_([s.value for s in ALLOWED["mark_paid"]]))
    .values(status=bindparam("new_status"), payment_session_id=bindparam("session_id"), payment_processing_at=None,
            updated_at=bindparam("now", type_=_orders.c.updated_at.type), version=_orders.c.version + 1)
)


def _apply_usual_payment(view, *, source: str, now: datetime) -> Applied | None:
    """The notice nearly every paid order gets: its own session, paid, proof accepted, the order
    waiting in PaymentInitiated. Applied with two statements on the table (read, then the
    version-guarded UPDATE) and the events written explicitly, instead of loading and flushing
    the mapped Order (~20% of a webhook delivery's CPU). Returns None for anything else, which
    takes the general path below; a concurrent writer makes the UPDATE miss, and the caller's
    retry re-reads what it did."""
    if view.payment_status != "paid" or view.order_id is None or not 0 < view.order_id < 2**31:
        return None
    session = db.session
    row = session.execute(_PAYMENT_READ, {"order": view.order_id}).first()
    if row is None or row.status != S.PAYMENT_INITIATED.value or row.payment_session_id != view.id:
        return None
    if not check_payment_proof(order_total=row.total, order_currency=row.currency, amount_total=view.amount_total,
                               currency=view.currency, payment_status=view.payment_status).accepted:
        return None  # the general path records the refusal
    order = _PaymentSnapshot(*row)
    transition = order.mark_paid(view.id, view.amount_total, view.currency)
    if not transition.ok:
        return None
    moved = session.execute(_MARK_PAID, dict(order=order.id, seen=row.version, new_status=order.status,
                                             session_id=order.payment_session_id, now=now)).rowcount
    if moved != 1:
        raise StaleDataError(f"order {order.reference} changed while its payment was being applied")
    write_events(session, transition.events, now)
    log.info("order %s paid (session %s, via %s)", order.reference, view.id, source)
    return Applied("paid", order)


def _apply_once(view, *, source, failed, event_id, now, expired_by_cancel: bool = False) -> Applied:
    session = db.session
    if event_id and not _claim_event(session, event_id, now):
        return Applied("duplicate")
    usual = _apply_usual_payment(view, source=source, now=now)
    if usual is not None:
        return usual
    order = find_order(view)
    if order is None:
        log.warning("provider session %s (via %s) names no order we know (metadata.order_id=%s, ref=%s)",
                    view.id, source, view.order_id, view.client_reference_id)
        return Applied("unknown_order", detail=f"session {view.id}")
    state = S(order.status)

    if view.payment_status == "paid":
        verdict = check_payment_proof(order_total=order.total, order_currency=order.currency,
                                      amount_total=view.amount_total, currency=view.currency,
                                      payment_status=view.payment_status)
        if not verdict.accepted:
            session.add(PaymentProofRefusal(order_id=order.id, session_id=view.id, source=source,
                                            problems=verdict.describe(), amount_total=view.amount_total,
                                            currency=(view.currency or "")[:3] or None, created_at=now))
            log.warning("payment proof refused for order %s, session %s (via %s): %s; order left %s. "
                        "Check the payment at the provider and reconcile by hand.",
                        order.reference, view.id, source, verdict.describe(), order.status)
            return Applied("proof_refused", order, verdict.describe())
        if state is S.PAID:
            if order.payment_session_id == view.id:
                return Applied("noop", order, "already paid")
            return _late_money(order, view, "paid twice: order already paid through another session", now)
        if state is S.CANCELLED:
            return _late_money(order, view, "payment arrived after the order was cancelled", now)
        if state in (S.PENDING_PAYMENT, S.PAYMENT_FAILED):
            order.start_payment(view.id, view.url)  # the money is real: adopt its session first
        order.mark_paid(view.id, view.amount_total, view.currency)
        order.payment_processing_at = None  # settled: nothing more is coming
        log.info("order %s paid (session %s, via %s)", order.reference, view.id, source)
        return Applied("paid", order)

    if state is S.CANCELLED and order.payment_session_id == view.id and view.status == "complete" \
            and order.payment_processing_at is None:
        _note_processing(order.id, now)  # money may still come for a cancelled order: the sweep watches it
    if state is not S.PAYMENT_INITIATED or order.payment_session_id != view.id:
        return Applied("noop", order, f"order is {order.status}")
    if view.status == "expired":
        if expired_by_cancel:
            # The customer's cancel expired this session and its own commit has not landed yet
            # (or never will: the process died after the provider call). The expiry is the
            # cancel's, not a failed attempt: cancel here, and the cancel, finding the order
            # Cancelled when its version check misses, answers that it is.
            result = order.cancel(CANCELLED_BY_CUSTOMER)
            if isinstance(result, Refused):
                return Applied("noop", order, result.message)
            log.info("order %s cancelled: its session was expired by the customer's cancel (via %s)",
                     order.reference, source)
            return Applied("cancelled", order)
        if _window_ran_out(order, view, now):
            # The session lived until the order's pay-by time (docs/REFERENCE.md, Settings): it expiring
            # then is the payment window ending, so the order is cancelled and its stock given
            # back, as the deadline would for an unpaid order. Not a failed payment with a fresh
            # window, which would hold the stock for a second window after the customer left.
            result = order.cancel(PAYMENT_WINDOW_EXPIRED)
            if isinstance(result, Refused):
                return Applied("noop", order, result.message)
            log.info("order %s cancelled: its payment session expired at the end of the window (via %s)",
                     order.reference, source)
            return Applied("cancelled", order)
        order.mark_payment_failed("checkout session expired")
        order.last_payment_error = "The payment page expired before payment."
        order.payment_processing_at = None
        return Applied("payment_failed", order)
    if failed:
        order.mark_payment_failed("payment failed at the provider")
        order.last_payment_error = "Your payment did not go through."
        order.payment_processing_at = None
        return Applied("payment_failed", order)
    if view.status == "complete":
        if order.payment_processing_at is None:
            _note_processing(order.id, now)
        return Applied("awaiting_async", order)
    return Applied("noop", order, f"session {view.status}")


# The provider expires a session by its own clock (Stripe never early, often late); ours may run
# a little behind it. Kept small: a session expired well before its time (by hand, or by a test
# moving the sandbox's clock) is a failed attempt, not the end of the window.
EXPIRY_CLOCK_SLACK = timedelta(seconds=5)


def _window_ran_out(order: Order, view, now: datetime) -> bool:
    """Did the session expire because its time was up (as opposed to being expired early)? Its
    expires_at, the order's pay-by, has passed."""
    expires = view.expires_at or order.payment_session_expires_at
    return expires is not None and as_utc(now) >= as_utc(expires) - EXPIRY_CLOCK_SLACK


def apply_in_transaction(view: gateway.SessionView, *, source: str, now: datetime) -> Applied:
    """apply_session's guarded transitions inside the caller's transaction, without committing:
    for a caller that commits together with its own bookkeeping (the deadline command)."""
    return _apply_once(view, source=source, failed=_async_failed(view), event_id=None, now=now)


_NOTE_PROCESSING = (update(_orders).where(_orders.c.id == bindparam("order"))
                    .values(payment_processing_at=bindparam("now", type_=_orders.c.payment_processing_at.type),
                            updated_at=_orders.c.updated_at))
_STOP_WATCHING = (update(_orders).where(_orders.c.id == bindparam("order"))
                  .values(payment_processing_at=None, provider_next_check_at=None, updated_at=_orders.c.updated_at))


def stop_watching(order_id: int) -> None:
    """No more money can come for this order's session (refunded, failed, expired): clear the mark."""
    db.session.execute(_STOP_WATCHING, {"order": order_id})


def _note_processing(order_id: int, now: datetime) -> None:
    """In the caller's transaction, on the table: not a state change (see Order.payment_processing_at)."""
    db.session.execute(_NOTE_PROCESSING, {"order": order_id, "now": now})


def _late_money(order: Order, view, reason: str, now: datetime) -> Applied:
    created = record_late_payment(order, view, reason, now)
    if created and S(order.status) is S.CANCELLED and order.payment_session_id == view.id \
            and order.payment_processing_at is None:
        # The sweep's watch follows the refund until the provider has it (a refund that dies
        # runs again), not just until the refund is recorded; the refund's success ends it.
        _note_processing(order.id, now)
    return Applied("refund_created" if created else "already_refunded", order, reason)


def reconcile_order(order_id: int, source: str = "console", now: datetime | None = None) -> Applied:
    """Ask the provider about the order's current session now and apply the answer."""
    order = db.session.get(Order, order_id)
    if order is None or not order.payment_session_id:
        db.session.rollback()
        return Applied("noop", order, "no payment session to ask about")
    sid = order.payment_session_id
    db.session.rollback()
    view = gateway.retrieve_session(sid)
    return apply_session(view, source=source, failed=_async_failed(view), now=now)


def _async_failed(view) -> bool:
    """A completed-but-unpaid session whose payment is no longer processing has failed."""
    return view.status == "complete" and view.payment_status == "unpaid" and view.payment_intent is not None \
        and gateway.payment_intent_failed(view.payment_intent)
