"""Payments the provider holds until the order ships (CAPTURE_MODE=dispatch; docs/REFERENCE.md,
Order states): the proof of a hold, the Authorized transition, and what settles a hold.

A session whose card payment is held reports `payment_status: "unpaid"` even when complete, as
Stripe's does; the proof is its PaymentIntent: `requires_capture` with `amount_capturable` equal
to what the session charges (the answer must expand the payment, as `gateway.retrieve_session`
does). A hold is taken at most once, by the capture command a ship schedules (its own
idempotency key), and a hold the order cannot take is voided, never captured and refunded:
cancelling an uncaptured payment costs nothing, a refund costs the provider's fee."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import NoReturn

from flask import current_app

from ..domain.deadlines import as_utc, utcnow
from ..domain.order import HOLD_LAPSING, OrderStatus, Transition
from ..domain.payment import CaptureMode
from ..domain.results import Refused
from ..extensions import db
from ..models import CommandKind, PaymentProofRefusal, ScheduledCommand
from ..outbox import schedule_command, uow
from ..outbox.failures import DeadEnd, PermanentFailure, Reschedule
from ..provider import gateway
from ..store import order_store
from ..store.order_store import LoadedOrder
from .proof import charge_of, proof_of
from .refunds import PAID_TWICE, record_late_payment

log = logging.getLogger("shop.payments")

CAPTURE_KEY = "capture-order-{order}-{intent}"
VOID_KEY = "void-{intent}"
# Why an order's cancel was refused while its capture is under way.
BEING_SHIPPED = "order_being_shipped"


def is_held(view: gateway.SessionView) -> bool:
    """The provider holds this session's payment for a later capture (the answer expanded it)."""
    capturable = view.hold.amount_capturable
    return (
        view.status == gateway.SessionStatus.COMPLETE
        and view.payment_status == gateway.SessionPaymentStatus.UNPAID
        and capturable is not None
        and capturable > 0
    )


def may_be_held(view: gateway.SessionView) -> bool:
    """A completed session reporting `unpaid` that asked for card payments to be held (or any,
    under CAPTURE_MODE=dispatch) may hold one for a later capture; only the session read with its
    payment says (an event's copy, or a listed event, names its payment without it). Every path
    that has only such a copy asks first. The session's own word covers sessions made before
    the mode was switched back to `checkout`."""
    return (
        view.status == gateway.SessionStatus.COMPLETE
        and view.payment_status == gateway.SessionPaymentStatus.UNPAID
        and (
            view.hold.capture_method == gateway.CaptureMethod.MANUAL
            or current_app.config["CAPTURE_MODE"] == CaptureMode.DISPATCH
        )
    )


def hold_problems(order: LoadedOrder, view: gateway.SessionView) -> str:
    """ "" when the hold pays this order (the payment proof, as for a paid session, and the amount
    capturable all that the session charges), else what is wrong, in words."""
    verdict = proof_of(order, replace(view, payment_status=gateway.SessionPaymentStatus.PAID))
    problems = list(verdict.problems)
    if view.hold.amount_capturable != view.amount_total:
        problems.append(f"amount_capturable {view.hold.amount_capturable} != amount_total {view.amount_total}")
    return "; ".join(problems)


# The states in which an order can still take a hold: waiting at the payment page (through this
# session or another), or not (or no longer) at one; the session is adopted then, as money is.
TAKES_A_HOLD = (OrderStatus.PAYMENT_INITIATED, OrderStatus.PENDING_PAYMENT, OrderStatus.PAYMENT_FAILED)


def apply_held(order: LoadedOrder, view: gateway.SessionView, *, source: str, now: datetime):
    """The provider holds money for `order` through `view`'s session: an order that can still
    take it (TAKES_A_HOLD) becomes Authorized when the hold pays it exactly (else the refusal is
    recorded for an operator, as for a paid session); a hold it cannot take (cancelled, or paid or
    authorized through another session) is voided, never captured and refunded. Returns
    (outcome word, detail)."""
    if order.status in TAKES_A_HOLD:
        problems = hold_problems(order, view)
        if problems:
            _refuse(order, view, problems, source=source, now=now)
            return "proof_refused", problems
        _authorize(order, view, now=now)
        log.info("order %s authorized: held until it ships (session %s, via %s)", order.reference, view.id, source)
        return "authorized", ""
    if order.status is OrderStatus.AUTHORIZED and order.payment_session_id == view.id:
        return "noop", "already authorized"
    created = schedule_void(order.id, view.id, view.payment_intent, now)
    return ("void_created" if created else "noop"), f"money held for an order that is {order.status.value}"


def _refuse(order: LoadedOrder, view: gateway.SessionView, problems: str, *, source: str, now: datetime) -> None:
    db.session.add(
        PaymentProofRefusal(
            order_id=order.id,
            session_id=view.id,
            source=source,
            problems=problems,
            amount_total=view.amount_total,
            currency=(view.currency or "")[:3] or None,
            created_at=now,
        )
    )
    log.warning("held payment refused for order %s (session %s): %s", order.reference, view.id, problems)


def _authorize(order: LoadedOrder, view: gateway.SessionView, *, now: datetime) -> None:
    """Authorized through `view`'s session, with the hold's deadline armed; an order that had not
    started (or had failed) its payment adopts the session first, in the same write."""
    assert view.amount_total is not None and view.currency is not None  # the proof checked both
    transition, events = Transition.MARK_AUTHORIZED, ()
    if order.status is not OrderStatus.PAYMENT_INITIATED:
        adopted = order.start_payment(view.id, view.url)
        assert not isinstance(adopted, Refused), adopted  # both unpaid states start a payment
        transition, events = Transition.ADOPT_AND_AUTHORIZE, adopted.events
    result = order.mark_authorized(view.id, view.amount_total, view.currency)
    assert not isinstance(result, Refused), result  # PaymentInitiated may be authorized
    charge_of(order, view)
    order.held_until(view.hold.capture_before)
    order_store.save(order, transition, events + result.events, now=now)
    _arm_deadline(order, now)


def schedule_void(order_id: int, session_id: str | None, intent: str | None, now: datetime) -> bool:
    """Void the hold on the session's payment, once per session: False when it was asked before."""
    earlier = db.session.execute(
        db.select(ScheduledCommand.payload).where(
            ScheduledCommand.order_id == order_id, ScheduledCommand.kind == CommandKind.VOID_PAYMENT
        )
    ).scalars()
    if any((payload or {}).get("session_id") == session_id for payload in earlier):
        return False
    payload = {"session_id": session_id, "payment_intent": intent}
    schedule_command(db.session, CommandKind.VOID_PAYMENT, now, order_id=order_id, payload=payload, now=now)
    return True


def being_shipped(order: LoadedOrder) -> Refused | None:
    """The refusal of any cancel of an Authorized order a ship is capturing, else None."""
    if order.status is OrderStatus.AUTHORIZED and order.capture_requested_at is not None:
        return Refused(BEING_SHIPPED, "this order is being shipped: its payment is being taken")
    return None


def cancel_held(order: LoadedOrder, reason: str, now: datetime, *, ended: bool = False) -> Refused | None:
    """Cancel an Authorized order and void its hold, in the caller's transaction: the cancel's
    compensation gives the stock back as for any cancel. Refused while a ship is capturing it,
    unless the hold `ended` at the provider: then that capture cannot succeed (a void of an ended
    hold finds nothing held)."""
    shipping = None if ended else being_shipped(order)
    if shipping is not None:
        return shipping
    result = order.cancel(reason)
    if isinstance(result, Refused):
        return result
    order_store.save(order, Transition.CANCEL, result.events, now=now)
    schedule_void(order.id, order.payment_session_id, None, now)
    log.info("order %s cancelled before its capture (%s): its hold is voided", order.reference, reason)
    return None


def execute_void(order_id: int, payload: dict, now: datetime) -> None:
    """The VOID_PAYMENT command, in the runner's transaction (raising retries it with backoff,
    then dead-letters it to an operator with the provider's answer). A payment already voided,
    or lapsed, is done. One captured meanwhile for an order paid through another session is
    money taken twice: refunded once, as late money. Any other captured one is an operator's."""
    intent = payload.get("payment_intent")
    if not intent:
        session_id = payload.get("session_id")
        if not session_id:
            raise PermanentFailure(f"void for order {order_id} names no payment session")
        intent = gateway.retrieve_session(session_id).payment_intent
        if not intent:
            return  # no payment was ever made through the session: nothing is held
    try:
        gateway.void_payment(intent, VOID_KEY.format(intent=intent))
    except gateway.ProviderRefused as exc:
        now_there = gateway.retrieve_payment(intent)
        if now_there.status == gateway.PaymentIntentStatus.CANCELED:
            return  # voided already, or the hold lapsed: nothing is held
        if now_there.status == gateway.PaymentIntentStatus.SUCCEEDED and _taken_twice(order_id, payload, now):
            return
        raise PermanentFailure(
            f"the provider would not void payment {intent} of order {order_id} ({exc}); it is "
            f"{now_there.status}: check the payment at the provider and refund it by hand if it was taken"
        ) from exc
    log.info("order %s: hold on payment %s voided", order_id, intent)


def _taken_twice(order_id: int, payload: dict, now: datetime) -> bool:
    """The void's session was captured while its order is paid through another: its money is
    refunded once (the late-money refund, keyed by order and session). False for anything else."""
    session_id = payload.get("session_id")
    order = order_store.read(order_id)
    if not session_id or order is None or order.status is not OrderStatus.PAID:
        return False
    if order.payment_session_id == session_id:
        return False
    record_late_payment(order, gateway.retrieve_session(session_id), PAID_TWICE, now)
    return True


def _margin() -> timedelta:
    return timedelta(seconds=current_app.config["AUTHORIZATION_MARGIN_SECONDS"])


def _arm_deadline(order: LoadedOrder, now: datetime) -> None:
    """The hold's own deadline (END_HOLD), AUTHORIZATION_MARGIN_SECONDS before it lapses, in the
    Authorized transition's transaction. A hold whose lapse the provider did not say has none."""
    if order.hold_expires_at is None:
        log.warning("order %s authorized with no capture_before: its hold has no deadline", order.reference)
        return
    due = max(now, as_utc(order.hold_expires_at) - _margin())
    schedule_command(db.session, CommandKind.END_HOLD, due, order_id=order.id, now=now)


def end_hold(order_id: int, now: datetime) -> str:
    """The END_HOLD command, in the runner's transaction: an order still Authorized, and not being
    captured, is cancelled and its hold voided before the hold lapses unseen (the customer gets
    the notice; the compensation gives the stock back). Anything else is left alone."""
    order = order_store.read(order_id)
    if order is None or order.status is not OrderStatus.AUTHORIZED:
        return "changed"
    if order.capture_requested_at is not None:
        return "being_captured"
    if order.hold_expires_at is not None:
        due = as_utc(order.hold_expires_at) - _margin()
        if due > now + timedelta(seconds=5):
            raise Reschedule(due)  # fired early
    refused = cancel_held(order, HOLD_LAPSING, now)
    if refused is not None:
        return refused.code
    log.warning("order %s: not shipped before its payment hold lapses; cancelled and its hold voided", order.reference)
    return "cancelled"


@dataclass
class HoldNews:
    """What a hold's end at the provider did (the webhook's receipt says it)."""

    outcome: str
    order_id: int | None
    detail: str = ""


def hold_ended(
    view: gateway.PaymentView, *, before_commit, now: datetime | None = None, lapsed_charge: str | None = None
) -> HoldNews:
    """The provider says a held payment ended uncaptured (`payment_intent.canceled`: voided, or the
    hold lapsed; or `lapsed_charge`, its latest charge, expired): an order still Authorized ends
    as at the hold's deadline (cancelled, stock back, customer told), even one being captured:
    that capture cannot succeed now, and finding the order cancelled it tells an operator so.
    Whichever of the two notices comes first ends it; the other, or a repeat, finds it ended and
    changes nothing. `before_commit(news)` runs in the same transaction."""
    now = now or utcnow()

    def attempt(_n: int) -> HoldNews:
        with uow.transaction():
            order = order_store.read(view.order_id) if view.order_id is not None else None
            if order is None:
                news = HoldNews("unknown_order", view.order_id)
            elif order.status is not OrderStatus.AUTHORIZED or not _ended(view, lapsed_charge):
                news = HoldNews("noop", order.id, f"order is {order.status.value}")
            else:
                refused = cancel_held(order, HOLD_LAPSING, now, ended=True)
                news = HoldNews(
                    "cancelled" if refused is None else "noop", order.id, refused.message if refused else ""
                )
            before_commit(news)
        return news

    # Both notices of one lapse may arrive at once: the loser's retry finds the order ended.
    return order_store.retry_on_lost_race(4, attempt)


def _ended(view: gateway.PaymentView, lapsed_charge: str | None) -> bool:
    """The payment can no longer be captured: cancelled, or the charge that held it expired (the
    payment was not captured meanwhile)."""
    if view.status == gateway.PaymentIntentStatus.CANCELED:
        return True
    return (
        lapsed_charge is not None
        and view.latest_charge == lapsed_charge
        and view.status != gateway.PaymentIntentStatus.SUCCEEDED
    )


def hold_lapsed(intent_id: str, charge_id: str | None, *, before_commit, now: datetime | None = None) -> HoldNews:
    """`charge.expired`: a held payment's charge lapsed uncaptured. The charge does not name the
    order; its payment does, so the provider is asked for it (no transaction open meanwhile), then
    the order ends exactly as for `payment_intent.canceled` (`hold_ended`)."""
    view = gateway.retrieve_payment(intent_id)
    return hold_ended(view, before_commit=before_commit, now=now, lapsed_charge=charge_id)


def capture_refused(order: LoadedOrder, intent: str, exc: gateway.ProviderRefused, now: datetime) -> NoReturn:
    """The capture of `order`'s hold was refused, in the capture command's transaction; always a
    dead letter in words for an operator (DeadEnd), naming the order and the provider's answer,
    with what it wrote. A hold that ended (the payment canceled: lapsed or voided; or the
    authorization expired) ends the order as a lapsed hold does: cancelled, stock back through the
    compensation, customer told. Any other refusal leaves the hold: the ask is withdrawn, so the
    order can be shipped again or cancelled (its hold voided), and the hold's deadline is armed
    again in case it already ran."""
    payment = gateway.retrieve_payment(intent)
    answer = f"the provider said: {exc} ({exc.code or 'no code'}); the payment is {payment.status}"
    ref = order.reference
    if payment.status == gateway.PaymentIntentStatus.CANCELED or exc.code == gateway.CHARGE_EXPIRED_FOR_CAPTURE:
        refused = cancel_held(order, HOLD_LAPSING, now, ended=True)
        assert refused is None, refused  # an Authorized order may be cancelled
        raise DeadEnd(
            f"order {ref} was not shipped: its payment hold ended before the capture ({answer}). Nothing was "
            "taken; the order is cancelled as a lapsed hold is (its stock comes back, its customer is told). "
            "Discard this once read."
        )
    if not order_store.note_capture_refused(order.id):
        raise order_store.LostRace(order, Transition.SHIP)
    _arm_deadline(order, now)
    raise DeadEnd(
        f"the provider refused to capture the held payment of order {ref} ({answer}): it was not shipped, "
        "and it is no longer being shipped. Ship it again (or retry this), or cancel it: its hold is voided "
        "and its stock comes back."
    )
