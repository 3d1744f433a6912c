"""Applying what the provider says about a Checkout Session: the one guarded path shared by the
webhook, the return page, the deadline, the sweep and the console (`apply_session`, and
`ask_and_apply` for those that ask the provider first), including the usual-payment fast path
and money that arrives for an order that can no longer take it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Callable

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm.exc import StaleDataError

from ..domain.deadlines import as_utc, utcnow
from ..domain.order import CANCELLED_BY_CUSTOMER, PAYMENT_WINDOW_EXPIRED, OrderStatus, Transition
from ..domain.results import Ok, Refused
from ..extensions import db
from ..models import PaymentProofRefusal
from ..outbox import uow
from ..provider import gateway
from ..store import order_store
from ..store.order_store import LoadedOrder, Note
from . import holds
from .event_claims import claim_event
from .proof import charge_of, proof_of
from .refunds import PAID_AFTER_CANCEL, PAID_TWICE, record_late_payment, refunded_by_shop
from .unknown_sighting import record_unknown_payment

log = logging.getLogger("shop.payments")

# The OrderCancelled reason when a restored copy learns of such a cancel from the refund.
CANCELLED_BEFORE_PAYMENT_REFUNDED = "cancelled before its payment arrived; the payment was refunded"


class Outcome(StrEnum):
    """What applying a notice did (Applied.outcome)."""

    PAID = "paid"
    PAYMENT_FAILED = "payment_failed"
    CANCELLED = "cancelled"
    REFUND_CREATED = "refund_created"
    ALREADY_REFUNDED = "already_refunded"
    NOOP = "noop"
    DUPLICATE = "duplicate"
    UNKNOWN_ORDER = "unknown_order"
    PROOF_REFUSED = "proof_refused"
    AWAITING_ASYNC = "awaiting_async"
    AUTHORIZED = "authorized"  # the payment is held until the order ships (payments.holds)
    VOID_CREATED = "void_created"  # money held for an order that cannot take it: voided


@dataclass
class Applied:
    outcome: Outcome
    order: LoadedOrder | None = None  # the order as this notice left it
    detail: str = ""


def find_order(view: gateway.SessionView) -> LoadedOrder | None:
    """The order a session names: by metadata.order_id (the sender's text, so an id the column
    cannot hold is no order, not a failed lookup), else by client_reference_id."""
    order = order_store.read(view.order_id) if view.order_id is not None else None
    if order is not None and view.client_reference_id and order.reference != view.client_reference_id:
        # The id is another order's: a database restored from an older copy hands the ids of
        # the orders it lost to new ones. The reference is random and never reused.
        order = None
    if order is None and view.client_reference_id:
        order = order_store.read_by_reference(view.client_reference_id)
    return order


def apply_session(
    view: gateway.SessionView,
    *,
    source: str,
    failed: bool = False,
    event_id: str | None = None,
    now: datetime | None = None,
    before_commit: Callable[[Applied], None] | None = None,
    expired_by_cancel: bool = False,
    refunded_as: str | None = None,
) -> Applied:
    """Apply the provider's facts about one session to its order, in one transaction, through
    the guarded transitions. `failed` says the provider reported the (async) payment failed;
    `expired_by_cancel` that the session's expiry was a customer's cancel retiring it.
    Idempotent: a repeat finds the order already moved and does nothing. Retries itself on a
    version conflict, because the other writer may have made this notice a no-op.

    `before_commit(result)`, when given, runs inside that same transaction just before it
    commits, on every path that returns (duplicates included): the webhook writes its receipt
    there, so a delivery costs one commit. Anything raised rolls the whole attempt back.

    `refunded_as` is the reason of the shop's own late-money refund of this payment that the
    provider already holds (asked by `ask_and_apply` when the answer shows money refunded, and by
    the sweep's scan for a payment no order holds): the machine a restored copy replaces refunded
    it, so the copy does what that machine did, never pays the order with money given back."""
    now = now or utcnow()

    def attempt(_n: int) -> Applied:
        with uow.transaction():
            result = _apply_once(
                view,
                source=source,
                failed=failed,
                event_id=event_id,
                now=now,
                expired_by_cancel=expired_by_cancel,
                refunded_as=refunded_as,
            )
            if before_commit is not None:
                before_commit(result)
        return result

    # Another writer got there first (moved the order, or claimed the event where the dialect has
    # no ON CONFLICT): the transaction has rolled back, and the next try sees what it did, which
    # may make this notice a duplicate or a no-op.
    return order_store.retry_on_lost_race(4, attempt, also=(IntegrityError, StaleDataError))


def _apply_usual_payment(view, *, source: str, now: datetime) -> Applied | None:
    """The notice nearly every paid order gets: its own session, paid, proof accepted, the order
    waiting in PaymentInitiated. Applied with two statements (the store's narrow read, then its
    version-guarded save with the events), without building the mapped Order (~20% of a webhook
    delivery's CPU). Returns None for anything else, which takes the general path below; a
    concurrent writer makes the save miss (LostRace), and the caller's retry re-reads what it did."""
    if view.payment_status != gateway.SessionPaymentStatus.PAID or not order_store.usable_id(view.order_id):
        return None
    order = order_store.read_for_payment(view.order_id)
    if order is None or order.status is not OrderStatus.PAYMENT_INITIATED or order.payment_session_id != view.id:
        return None
    if not proof_of(order, view).accepted:
        return None  # the general path records the refusal
    transition = order.mark_paid(view.id, view.amount_total, view.currency)
    if isinstance(transition, Refused):
        return None
    charge_of(order, view)
    order_store.save(order, Transition.MARK_PAID, transition.events, now=now)
    log.info("order %s paid (session %s, via %s)", order.reference, view.id, source)
    return Applied(Outcome.PAID, order)


def _apply_once(
    view, *, source, failed, event_id, now, expired_by_cancel: bool = False, refunded_as: str | None = None
) -> Applied:
    if event_id and not claim_event(db.session, event_id, now):
        return Applied(Outcome.DUPLICATE)
    usual = None if refunded_as else _apply_usual_payment(view, source=source, now=now)
    if usual is not None:
        return usual
    order = find_order(view)
    if order is None:
        log.warning(
            "provider session %s (via %s) names no order we know (metadata.order_id=%s, ref=%s)",
            view.id,
            source,
            view.order_id,
            view.client_reference_id,
        )
        if (view.payment_status == gateway.SessionPaymentStatus.PAID or holds.is_held(view)) and view.id:
            # Money for no order this database knows is never kept: checked with the provider,
            # then applied or refunded (shop.payments.unknown_money).
            record_unknown_payment(view, found_via=source, now=now)
        return Applied(Outcome.UNKNOWN_ORDER, detail=f"session {view.id}")
    if view.payment_status == gateway.SessionPaymentStatus.PAID or holds.is_held(view):
        return _apply_paid(order, view, source=source, now=now, refunded_as=refunded_as)
    if (
        order.status is OrderStatus.CANCELLED
        and order.payment_session_id == view.id
        and view.status == gateway.SessionStatus.COMPLETE
        and order.late_money_watch_since is None
    ):
        order_store.note(order.id, Note.WATCH, now)  # money may still come for a cancelled order
    if order.status is not OrderStatus.PAYMENT_INITIATED or order.payment_session_id != view.id:
        return Applied(Outcome.NOOP, order, f"order is {order.status}")
    if view.status == gateway.SessionStatus.EXPIRED:
        return _apply_expired(order, view, source=source, now=now, expired_by_cancel=expired_by_cancel)
    if failed:
        return _fail(order, "payment failed at the provider", "Your payment did not go through.")
    if view.status == gateway.SessionStatus.COMPLETE:
        if order.payment_processing_at is None:
            order_store.note(order.id, Note.PROCESSING, now)
        return Applied(Outcome.AWAITING_ASYNC, order)
    return Applied(Outcome.NOOP, order, f"session {view.status}")


def _apply_paid(order: LoadedOrder, view, *, source: str, now: datetime, refunded_as: str | None = None) -> Applied:
    """The provider says the session is paid: check the proof, then pay the order, or refund money
    it can no longer take. A held payment (CAPTURE_MODE=dispatch) is payments.holds'; money taken
    at once for an order Authorized through another session pays it, and that hold is voided."""
    if holds.is_held(view):
        word, detail = holds.apply_held(order, view, source=source, now=now)
        return Applied(Outcome(word), order, detail)
    verdict = proof_of(order, view)
    if not verdict.accepted:
        db.session.add(
            PaymentProofRefusal(
                order_id=order.id,
                session_id=view.id,
                source=source,
                problems=verdict.describe(),
                amount_total=view.amount_total,
                currency=(view.currency or "")[:3] or None,
                created_at=now,
            )
        )
        log.warning(
            "payment proof refused for order %s, session %s (via %s): %s; order left %s. "
            "Check the payment at the provider and reconcile by hand.",
            order.reference,
            view.id,
            source,
            verdict.describe(),
            order.status,
        )
        return Applied(Outcome.PROOF_REFUSED, order, verdict.describe())
    state = order.status
    if state is OrderStatus.PAID:
        if order.payment_session_id == view.id:
            return Applied(Outcome.NOOP, order, "already paid")
        return _late_money(order, view, PAID_TWICE, now)
    if state is OrderStatus.CANCELLED:
        return _late_money(order, view, PAID_AFTER_CANCEL, now)
    if refunded_as in (PAID_TWICE, PAID_AFTER_CANCEL):
        return _refunded_elsewhere(order, view, refunded_as, source=source, now=now)
    transition, events = Transition.MARK_PAID, ()
    if state in {OrderStatus.PENDING_PAYMENT, OrderStatus.PAYMENT_FAILED}:
        adopted = order.start_payment(view.id, view.url)  # the money is real: adopt its session first
        assert isinstance(adopted, Ok), adopted  # both states start a payment
        events, transition = adopted.events, Transition.ADOPT_AND_PAY
    if state is OrderStatus.AUTHORIZED and order.payment_session_id != view.id:
        # Money taken at once through another session pays it: the hold is given back (voided).
        holds.schedule_void(order.id, order.payment_session_id, None, now)
    paid = order.mark_paid(view.id, view.amount_total, view.currency)
    assert isinstance(paid, Ok), paid  # the proof was checked above, and the state allows it
    events += paid.events
    charge_of(order, view)
    # The write's own time, as for every other transition of the general path (`now` may be the caller's).
    order_store.save(order, transition, events, now=utcnow())
    log.info("order %s paid (session %s, via %s)", order.reference, view.id, source)
    return Applied(Outcome.PAID, order)


def _refunded_elsewhere(order: LoadedOrder, view, reason: str, *, source: str, now: datetime) -> Applied:
    """A live order's payment that the provider shows refunded by this shop as late money: the
    machine a restored copy replaces had the order cancelled (or paid through another session)
    when the money came. The copy follows it: the order cancelled (its stock given back by the
    compensation) unless it was paid twice, and the refund recorded under the same reason, whose
    command replays the refund the provider already made rather than making another."""
    if reason == PAID_AFTER_CANCEL:
        result = order.cancel(CANCELLED_BEFORE_PAYMENT_REFUNDED)
        if isinstance(result, Refused):
            return Applied(Outcome.NOOP, order, result.message)
        order_store.save(order, Transition.CANCEL, result.events)
        log.warning(
            "order %s cancelled: the provider shows its payment (session %s) refunded by this shop after a "
            "cancel this database never saw (via %s)",
            order.reference,
            view.id,
            source,
        )
    return _late_money(order, view, reason, now)


def _apply_expired(order: LoadedOrder, view, *, source: str, now: datetime, expired_by_cancel: bool) -> Applied:
    """The order's own session expired while the order waited at the provider."""
    if expired_by_cancel or _window_ran_out(order, view, now):
        # Either the customer's cancel expired this session and its own commit has not landed
        # yet (or never will: the process died after the provider call): the expiry is the
        # cancel's, not a failed attempt, and the cancel, finding the order Cancelled when its
        # version check misses, answers that it is. Or the session lived until the order's
        # pay-by time (docs/REFERENCE.md, Settings): it expiring then is the payment window
        # ending, so the order is cancelled and its stock given back, as the deadline would
        # for an unpaid order; not a failed payment with a fresh window, which would hold the
        # stock for a second window after the customer left.
        why = CANCELLED_BY_CUSTOMER if expired_by_cancel else PAYMENT_WINDOW_EXPIRED
        result = order.cancel(why)
        if isinstance(result, Refused):
            return Applied(Outcome.NOOP, order, result.message)
        order_store.save(order, Transition.CANCEL, result.events)
        log.info("order %s cancelled: its payment session expired (%s, via %s)", order.reference, why, source)
        return Applied(Outcome.CANCELLED, order)
    return _fail(order, "checkout session expired", "The payment page expired before payment.")


def _fail(order: LoadedOrder, reason: str, words: str) -> Applied:
    """PaymentInitiated -> PaymentFailed, with the words the customer's order page shows."""
    result = order.mark_payment_failed(reason)
    if isinstance(result, Refused):
        return Applied(Outcome.NOOP, order, result.message)
    order.failed_because(words)
    order_store.save(order, Transition.MARK_PAYMENT_FAILED, result.events)
    return Applied(Outcome.PAYMENT_FAILED, order)


# The provider expires a session by its own clock (Stripe never early, often late); ours may run
# a little behind it. Kept small: a session expired well before its time (by hand, or by a test
# moving the sandbox's clock) is a failed attempt, not the end of the window.
EXPIRY_CLOCK_SLACK = timedelta(seconds=5)


def _window_ran_out(order: LoadedOrder, view, now: datetime) -> bool:
    """Did the session expire because its time was up (as opposed to being expired early)? Its
    expires_at, the order's pay-by, has passed."""
    expires = view.expires_at or order.payment_session_expires_at
    return expires is not None and as_utc(now) >= as_utc(expires) - EXPIRY_CLOCK_SLACK


def _late_money(order: LoadedOrder, view, reason: str, now: datetime) -> Applied:
    created = record_late_payment(order, view, reason, now)
    if (
        created
        and order.status is OrderStatus.CANCELLED
        and order.payment_session_id == view.id
        and order.late_money_watch_since is None
    ):
        # The sweep's watch follows the refund until the provider has it (a refund that dies
        # runs again), not just until the refund is recorded; the refund's success ends it.
        order_store.note(order.id, Note.WATCH, now)
    return Applied(Outcome.REFUND_CREATED if created else Outcome.ALREADY_REFUNDED, order, reason)


def reconcile_order(order_id: int, source: str = "console", now: datetime | None = None) -> Applied:
    """Ask the provider about the order's current session now and apply the answer."""
    order = order_store.read(order_id)
    if order is None or not order.payment_session_id:
        db.session.rollback()
        return Applied(Outcome.NOOP, order, "no payment session to ask about")
    sid = order.payment_session_id
    db.session.rollback()
    applied = ask_and_apply(sid, source=source, now=now).applied
    assert applied is not None  # without `for_order`, ask_and_apply always applies the answer
    return applied


def async_failed(view: gateway.SessionView) -> bool:
    """A completed-but-unpaid session whose payment is no longer processing has failed. Asks the
    provider about the payment only for such a session, and not for one whose answer shows it held."""
    return (
        view.status == gateway.SessionStatus.COMPLETE
        and view.payment_status == gateway.SessionPaymentStatus.UNPAID
        and view.payment_intent is not None
        and not holds.is_held(view)
        and gateway.payment_intent_failed(view.payment_intent)
    )


@dataclass
class Answer:
    view: gateway.SessionView  # what the provider said
    applied: Applied | None  # None when the session is not `for_order`'s: nothing was applied


def ask_and_apply(
    session_id: str,
    *,
    source: str,
    now: datetime | None = None,
    in_transaction: bool = False,
    for_order: int | None = None,
) -> Answer:
    """Ask the provider about a session now and apply its answer through the guarded path: the
    one way the return page, the deadline, the sweep and the console's reconcile learn what the
    provider knows. Provider errors (ProviderUnavailable, ProviderRefused) reach the caller, which
    decides what an unanswered question means for it; nothing was applied then.

    No transaction may be open across the provider call, except with `in_transaction`: the
    answer is then applied inside the caller's transaction, uncommitted, for a caller that commits
    it together with its own bookkeeping (the deadline command). `for_order` applies the answer
    only if the provider names that order as the session's (the return page's link is the
    customer's text).

    A paid answer whose payment the provider shows refunded is checked against the shop's own
    refunds (`refunded_as` of `apply_session`): the machine a restored copy replaces may have
    given that money back as late money already."""
    view = gateway.retrieve_session(session_id)
    if for_order is not None and view.order_id != for_order:
        return Answer(view, None)
    failed = async_failed(view)
    # The answer says how much of the payment was refunded: only money already (partly) given back
    # costs a second question, which refund it was.
    paid_back = view.payment_status == gateway.SessionPaymentStatus.PAID and view.amount_refunded
    refunded_as = refunded_by_shop(view) if paid_back else None
    if in_transaction:
        return Answer(
            view,
            _apply_once(
                view, source=source, failed=failed, event_id=None, now=now or utcnow(), refunded_as=refunded_as
            ),
        )
    return Answer(view, apply_session(view, source=source, failed=failed, now=now, refunded_as=refunded_as))


def apply_event_in_transaction(event: gateway.SessionEvent, *, source: str, now: datetime) -> Applied:
    """A listed event's session applied in the caller's transaction, uncommitted (shop.payments.expiry_reads)."""
    view, by_cancel = event.view, event.expired_by_cancel
    return _apply_once(view, source=source, failed=event.failed, event_id=None, now=now, expired_by_cancel=by_cancel)
