"""Starting a payment: a fresh hosted Checkout Session for an order (start_payment), and retiring
an order's session before a customer's cancel. What the provider then says about a session is
applied by `payments.apply`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from flask import current_app

from .. import queue
from ..domain.deadlines import session_expires_at, session_pay_by, utcnow
from ..domain.order import OrderStatus, Transition
from ..domain.payment import CaptureMode
from ..domain.results import Refused
from ..extensions import db
from ..models import ProviderRefusal, RefusalKind
from ..outbox import uow
from ..provider import gateway, guard
from ..public_urls import public_url, public_url_for
from ..store import order_store
from ..store.order_store import LoadedOrder, Note
from .payment_link import offer_payment_link_later

log = logging.getLogger("shop.payments")


class StartStatus(StrEnum):
    """Where a payment's start ended: started (the payment page's url), queued (in line for a
    session), unavailable (the provider could not start it now), refused (not payable)."""

    STARTED = "started"
    QUEUED = "queued"
    UNAVAILABLE = "unavailable"
    REFUSED = "refused"


class StartCode(StrEnum):
    """Why it ended there; the web says it in words (storefront.payment_words)."""

    STARTED = "started"
    IN_LINE = "in_line"  # joined the line (budget or bulkhead spent): the payment queue starts it
    STILL_IN_LINE = "still_in_line"  # the queue's own try: still no budget (`detail`), tried again
    UNREACHABLE = "unreachable"  # the provider could not be reached
    PROVIDER_REFUSED = "provider_refused"  # the provider turned the session down
    NO_PAGE = "no_page"  # the session came back without its page's url
    NO_SUCH_ORDER = "no_such_order"
    NOT_PAYABLE = "not_payable"  # the order's status (`order_status`) takes no payment
    TRANSITION_REFUSED = "transition_refused"  # the domain's refusal (`detail`)
    CHANGED = "changed"  # the order moved meanwhile: `order_status` now, None when it is gone


_STATUS = {
    StartCode.STARTED: StartStatus.STARTED,
    StartCode.IN_LINE: StartStatus.QUEUED,
    StartCode.STILL_IN_LINE: StartStatus.QUEUED,
    StartCode.UNREACHABLE: StartStatus.UNAVAILABLE,
    StartCode.PROVIDER_REFUSED: StartStatus.UNAVAILABLE,
    StartCode.NO_PAGE: StartStatus.UNAVAILABLE,
    StartCode.NO_SUCH_ORDER: StartStatus.REFUSED,
    StartCode.NOT_PAYABLE: StartStatus.REFUSED,
    StartCode.TRANSITION_REFUSED: StartStatus.REFUSED,
    StartCode.CHANGED: StartStatus.REFUSED,
}


@dataclass
class StartOutcome:
    code: StartCode
    url: str | None = None  # the payment page (STARTED)
    order_status: OrderStatus | None = None  # NOT_PAYABLE, CHANGED
    detail: str = ""  # TRANSITION_REFUSED: the domain's refusal; STILL_IN_LINE: the provider's

    @property
    def status(self) -> StartStatus:
        return _STATUS[self.code]


# How long a customer's place holds the line shut to checkouts that arrive after it, unless the
# payment queue renews it (see guard.ProviderGuard.hold_line).
LINE_HOLD_SECONDS = 3.0


def start_payment(order_id: int, now: datetime | None = None, *, placed=None, from_line: bool = False) -> StartOutcome:
    """PendingPayment / PaymentFailed -> PaymentInitiated with a fresh hosted Checkout Session.

    The provider call happens outside any transaction (no row lock is held across the
    network); the transition then commits only if nobody moved the order meanwhile: the store's
    version-guarded save (`store.order_store.save`) plus the PaymentInitiated event, in one commit.

    When the provider is fine but its budget for new sessions is spent (or this process has no
    free provider slot), a customer's order joins the line instead (`join_line`: IN_LINE),
    and the payment queue creates its session as soon as the budget allows
    (payments.checkout_queue, which calls this with `from_line`).

    `placed` (place_order's result, in the same request) says what the order is at version 1,
    so a checkout does not read back what it has just written."""
    now = now or utcnow()
    if placed is not None:
        order = LoadedOrder.just_placed(placed)
    else:
        order = order_store.read(order_id, lines=True)
        db.session.rollback()  # no transaction open across the provider call
        if order is None:
            return StartOutcome(StartCode.NO_SUCH_ORDER)
    if not order.can(Transition.START_PAYMENT):
        return StartOutcome(StartCode.NOT_PAYABLE, order_status=order.status)
    attempt = order.payment_attempts + 1
    try:
        view = _create_session(order, attempt, now)
    except gateway.ProviderUnavailable as exc:
        if exc.kind in gateway.BUDGET_KINDS:
            if from_line:  # still in line: the queue tries again when the budget allows
                return StartOutcome(StartCode.STILL_IN_LINE, detail=str(exc))
            join_line(order.id, now)
            log.info("order %s joins the line for a payment session: %s", order.reference, exc)
            return StartOutcome(StartCode.IN_LINE)
        log.warning("order %s: payment provider unreachable, order stays %s: %s", order.reference, order.status, exc)
        _note_refusal(order.id, attempt, exc, kind=RefusalKind.UNAVAILABLE)
        if placed is not None:  # the checkout's own start: email the payment link once payments work again
            offer_payment_link_later(order.id, now)
        return StartOutcome(StartCode.UNREACHABLE)
    except gateway.ProviderRefused as exc:
        log.error("order %s: provider refused the checkout session: %s", order.reference, exc)
        _note_refusal(order.id, attempt, exc, leave_line=from_line)
        return StartOutcome(StartCode.PROVIDER_REFUSED)
    if not view.url:
        return _started_without_a_page(order, view, attempt, leave_line=from_line)
    return _save_started(order, view, attempt)


def _started_without_a_page(
    order: LoadedOrder, view: gateway.SessionView, attempt: int, *, leave_line: bool
) -> StartOutcome:
    """A Checkout Session's `url` is nullable at Stripe: one that came back without it is a
    payment that could not be started (a redirect to it would send the customer to "None"). It is
    expired so it can never take money, and the operator sees why on the order's timeline."""
    log.error("order %s: checkout session %s came back without a url; payment not started", order.reference, view.id)
    _expire_quietly(view.id)
    _note_refusal(
        order.id,
        attempt,
        gateway.ProviderRefused(
            f"checkout session {view.id} came back without a url to send the customer to", "session_without_url"
        ),
        leave_line=leave_line,
    )
    return StartOutcome(StartCode.NO_PAGE)


def _create_session(order: LoadedOrder, attempt: int, now: datetime) -> gateway.SessionView:
    """The hosted Checkout Session for this attempt; it lives until the order's pay-by time, which
    then is its expires_at. An order that had none yet (held only UNPAID_HOLD_WITHOUT_SESSION_SECONDS)
    gets the full window from now: its page exists from now on (domain.deadlines.session_pay_by)."""
    cfg = current_app.config
    assert order.updated_at is not None  # read from its row, or just placed: it has its last change
    pay_by = session_pay_by(order.status, order.updated_at, now, cfg["UNPAID_ORDER_EXPIRY_SECONDS"])
    return gateway.create_checkout_session(
        order_id=order.id,
        reference=order.reference,
        attempt=attempt,
        lines=order.lines,
        currency=order.currency,
        email=order.email,
        expires_at=session_expires_at(pay_by, now, cfg["STRIPE_SESSION_MIN_SECONDS"]),
        # The provider fills in {CHECKOUT_SESSION_ID}: written out, since url_for would escape the braces.
        success_url=public_url(f"/checkout/return?order={order.reference}&session_id={{CHECKOUT_SESSION_ID}}"),
        cancel_url=public_url_for("storefront.order_page", reference=order.reference, token=order.access_token),
        ship_to=cfg["SHIPPING_COUNTRIES"] if order.ships else None,
        tax_mode=cfg["TAX_MODE"],
        payment_methods=cfg["PAYMENT_METHODS"],
        hold_cards=cfg["CAPTURE_MODE"] == CaptureMode.DISPATCH,
    )


def _save_started(order: LoadedOrder, view: gateway.SessionView, attempt: int) -> StartOutcome:
    """Record the started attempt unless the order moved while the provider was asked."""
    transition = order.start_payment(view.id, view.url)
    if isinstance(
        transition, Refused
    ):  # checked before the provider call on the same snapshot; kept so the rule has one home
        _expire_quietly(view.id)
        return StartOutcome(StartCode.TRANSITION_REFUSED, detail=transition.message)
    order.attempt(attempt, view.expires_at)
    try:
        with uow.transaction():
            order_store.save(order, Transition.START_PAYMENT, transition.events)
    except order_store.LostRace:
        # A concurrent start of the same attempt (a double click on "Pay now") may have won
        # with the same Idempotency-Key, so the provider handed both the same session: that
        # one is the order's payment page now, not an unused one to expire.
        current = order_store.current_state(order.id)
        db.session.rollback()
        if current is None or current.payment_session_id != view.id:
            _expire_quietly(view.id)
        elif current.status is OrderStatus.PAYMENT_INITIATED:
            return StartOutcome(StartCode.STARTED, url=view.url)
        return StartOutcome(StartCode.CHANGED, order_status=current.status if current is not None else None)
    return StartOutcome(StartCode.STARTED, url=view.url)


def join_line(order_id: int, now: datetime) -> None:
    """Put an unpaid order in line for its payment session (it keeps its place if it already has
    one), durably: the mark is the order's own (`payment_queued_at`, a store note), committed
    before anything is said; then `joined_line`."""
    with uow.transaction():
        order_store.note(order_id, Note.QUEUE, now)
    joined_line(order_id)


def line_is_held() -> bool:
    """Has this process just met the line held shut to new sessions (guard.line_seen_held)? A
    checkout then places its order in line in its own transaction (checkout's `in_line`) and
    makes no provider call: in a sale, a refused call and a second commit per order are what the
    web would otherwise spend its time on."""
    return guard.get().line_seen_held()


def joined_line(order_id: int) -> None:
    """After the commit that put an order in line: hold the line shut to later checkouts and wake
    the payment queue (both only make it prompt: the queue finds the order in the database)."""
    guard.get().hold_line(LINE_HOLD_SECONDS)
    try:
        queue.wake_payment_queue()
    except Exception as exc:  # noqa: BLE001 - Redis away: the queue polls the database
        log.warning("could not wake the payment queue (%s); it finds order %s by itself", exc, order_id)


def _note_refusal(
    order_id: int,
    attempt: int,
    exc: gateway.ProviderRefused | gateway.ProviderUnavailable,
    *,
    leave_line: bool = False,
    kind: RefusalKind = RefusalKind.REFUSED,
) -> None:
    """Keep the provider's reason for the order's console timeline, in its own small commit (and
    take the order out of the line: asking again would be refused again). Bookkeeping only:
    failing to write it must not change what the customer is told.

    `kind` "unavailable": the provider could not be reached, failed or was not called (the
    breaker); its words and why (`exc.kind`) are kept the same way, so a payment that never
    started during an outage leaves its tries on the timeline."""
    try:
        with uow.transaction() as session:
            if leave_line:
                order_store.note(order_id, Note.LEAVE_QUEUE)
            code = getattr(exc, "code", None) if kind == RefusalKind.REFUSED else getattr(exc, "kind", None)
            session.add(
                ProviderRefusal(
                    order_id=order_id,
                    attempt=attempt,
                    code=(code or None) and str(code)[:100],
                    reason=str(exc),
                    kind=kind,
                )
            )
    except Exception:  # noqa: BLE001 - logged; the refusal itself is already in the log above
        log.exception("order %s: could not record the provider's refusal", order_id)


def _expire_quietly(session_id: str) -> None:
    try:
        gateway.expire_session(session_id)
    except Exception as exc:
        log.warning("could not expire unused session %s: %s", session_id, exc)


# The code of a cancel refused because the order's payment completed (the web says it in words).
PAYMENT_ALREADY_COMPLETED = "payment_already_completed"


def retire_session_before_cancel(order_id: int, reference: str, sid: str) -> Refused | bool:
    """Read the session's status; paid -> refuse the cancel (the payment stands). Otherwise
    expire it; if the expire fails, read again and refuse if it is now paid. Anything else
    (already expired, gone, provider down) is a warning and the cancellation proceeds.

    Called outside any transaction. True says the session could still take money (an async
    payment settling, or a session that could not be read or expired): the cancel marks the
    order so the sweep watches it (`sweep.watch_cancelled_payments`) and a lost late-payment
    webhook cannot leave the money kept."""
    paid = Refused(PAYMENT_ALREADY_COMPLETED, f"session {sid} is paid at the provider")
    try:
        view = gateway.retrieve_session(sid)
    except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
        log.warning("cancel of order %s: could not read session %s (%s); cancelling anyway", reference, sid, exc)
        return True
    if view.payment_status == gateway.SessionPaymentStatus.PAID:
        return paid
    if view.status != gateway.SessionStatus.OPEN:
        if view.status == gateway.SessionStatus.COMPLETE:
            log.warning(
                "cancel of order %s: session %s awaits an async payment; a late success will be refunded",
                reference,
                sid,
            )
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
        if again is not None and again.payment_status == gateway.SessionPaymentStatus.PAID:
            return paid
        log.warning("cancel of order %s: could not expire session %s (%s); cancelling anyway", reference, sid, exc)
        return True
