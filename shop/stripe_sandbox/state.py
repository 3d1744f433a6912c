"""The sandbox's world: sessions, payments, refunds, endpoints, events, its clock and faults.

One `Sandbox` holds everything in memory behind one re-entrant lock. Its methods take typed
arguments (the HTTP layer has already read and validated Stripe's params) and either change
state or raise a `StripeError`. Callers hold `sandbox.lock` around a whole request so that a
request, its idempotency record and the events it emits are one atomic step.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Iterable

from .account import Account, presentment
from .errors import StripeError, invalid, no_such, state_conflict
from .objects import (
    Charge,
    Delivery,
    EventRecord,
    LineItem,
    PaymentIntent,
    Refund,
    Session,
    WebhookEndpoint,
    new_id,
    render_charge,
    render_payment_intent,
    render_refund,
    render_session,
)
from .traffic import ApiGate, RequestLog
from .webhooks import WebhookDispatcher

log = logging.getLogger(__name__)

SESSION_MAX_SECONDS = 24 * 3600
# The hosted page's "pay later" choices settle this long after the customer leaves.
HOSTED_ASYNC_SETTLE_SECONDS = 2.0
TICK_SECONDS = 0.2

OUTCOMES = ("paid", "declined", "async_pending")
ASYNC_RESULTS = ("succeeded", "failed")
REFUND_OUTCOMES = ("succeeded", "failed")
# Why a refund failed, as Stripe says it (`refund.failure_reason`): the card it would go back to
# was closed or has expired, the commonest reason.
REFUND_FAILURE_REASON = "expired_or_canceled_card"

DECLINE_ERROR = {
    "type": "card_error",
    "code": "card_declined",
    "decline_code": "generic_decline",
    "message": "Your card was declined.",
}
# What a PaymentIntent can be canceled from (Stripe's list); one of a Checkout Session only from
# requires_capture (an open session is expired instead).
CANCELLABLE = ("requires_payment_method", "requires_capture", "requires_confirmation", "requires_action")
ASYNC_FAILURE_ERROR = {
    "type": "card_error",
    "code": "payment_intent_payment_attempt_failed",
    "message": "The payment failed.",
}

_ZERO_DECIMAL = {
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
    "ugx", "vnd", "vuv", "xaf", "xof", "xpf",
}  # fmt: skip
_SYMBOLS = {"usd": "$", "eur": "€", "gbp": "£", "jpy": "¥"}


def format_money(amount: int, currency: str) -> str:
    """`2500, "usd"` -> `$25.00`, the way Stripe's refund messages show amounts."""
    symbol = _SYMBOLS.get(currency, currency.upper() + " ")
    if currency in _ZERO_DECIMAL:
        return f"{symbol}{amount}"
    return f"{symbol}{amount / 100:.2f}"


# The address a scripted payment (POST /_sandbox/sessions/<id>/outcome without one) ships to.
TEST_SHIPPING_NAME = "Sandbox Customer"
# Where a customer who gave no address and ships nowhere is, for tax and Adaptive Pricing.
TEST_CUSTOMER_COUNTRY = "US"
ADDRESS_FIELDS = ("city", "country", "line1", "line2", "postal_code", "state")

LOCK_TIMEOUT_MESSAGE = (
    "This object cannot be accessed right now because another API request or Stripe process is "
    "currently accessing it (the sandbox's lock_timeout fault). Retry the request."
)


def sandbox_shipping_details(country: str) -> dict:
    return {
        "address": {
            "city": "Testville",
            "country": country,
            "line1": "1 Sandbox Street",
            "line2": None,
            "postal_code": "12345",
            "state": None,
        },
        "name": TEST_SHIPPING_NAME,
    }


# The hosted page's address form, in Stripe's field names: (field, label, required).
SHIPPING_FIELDS = (
    ("name", "Full name", True),
    ("line1", "Address line 1", True),
    ("line2", "Address line 2 (optional)", False),
    ("city", "City", True),
    ("postal_code", "Postal code", True),
    ("state", "State, county or region (optional)", False),
    ("country", "Country", True),
)
SHIPPING_FIELD_MAX = 200


def shipping_problems(session: Session, given: dict) -> tuple[dict | None, dict[str, str]]:
    """Check an address given for a session that collects one: (the shipping details in Stripe's
    shape, or None) and {field: what is wrong with it, in words}."""
    values = {
        name: (given.get(name) or "").strip() if isinstance(given.get(name), str) else ""
        for name, _, _ in SHIPPING_FIELDS
    }
    problems: dict[str, str] = {}
    for name, label, required in SHIPPING_FIELDS:
        if required and not values[name]:
            problems[name] = f"{label} is required."
        elif len(values[name]) > SHIPPING_FIELD_MAX:
            problems[name] = f"{label} can be at most {SHIPPING_FIELD_MAX} characters."
    country = values["country"].upper()
    if country and country not in (session.shipping_countries or []):
        problems["country"] = (
            f"We do not ship to {country}; choose one of {', '.join(session.shipping_countries or [])}."
        )
    if problems:
        return None, problems
    address = {key: values[key] or None for key in ("city", "line1", "line2", "postal_code", "state")}
    address["country"] = country
    return {"address": dict(sorted(address.items())), "name": values["name"]}, {}


class ControlError(Exception):
    """A refusal of a /_sandbox control call (not a Stripe API error)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Faults:
    drop_webhooks: int = 0
    duplicate_webhooks: bool = False
    reorder_webhooks: bool = False
    webhook_delay_seconds: float = 0.0
    # New refunds start `pending` and wait for /_sandbox/refunds/<id>/outcome.
    refunds_pending: bool = False
    # New Checkout Sessions come back with `url: null`.
    checkout_url_null: bool = False
    api_unavailable: bool = False
    api_latency_seconds: float = 0.0
    api_latency_jitter_seconds: float = 0.0
    api_hang: bool = False
    api_rate_limit_per_second: int = 0
    api_endpoint_rate_limit_per_second: int = 0
    # The next N /v1 calls answer the rate limit's 429, whatever the rates (counted down).
    api_rate_limit_next_calls: int = 0
    # The next N writes to one object answer Stripe's 429 `lock_timeout` (counted down).
    lock_timeout: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class RequestRef:
    """The API request that caused an event (Stripe's `event.request`)."""

    id: str | None = None
    idempotency_key: str | None = None


@dataclass
class StoredResponse:
    method: str
    path: str
    fingerprint: str
    status: int
    body: bytes
    request_id: str


class Sandbox:
    def __init__(self, min_session_seconds: int = 1800, *, start_threads: bool = True):
        if not 0 <= min_session_seconds <= SESSION_MAX_SECONDS:
            raise ValueError("min_session_seconds must be between 0 and 86400")
        self.min_session_seconds = int(min_session_seconds)
        self.lock = threading.RLock()
        self.dispatcher = WebhookDispatcher(self)
        # Own locks, not `self.lock`: see traffic.py for why.
        self.api_gate = ApiGate(lambda: self.faults)
        self.request_log = RequestLog()
        self._seq = 0
        self._clear()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if start_threads:
            self.start()

    # -- lifecycle -------------------------------------------------------------------

    def _clear(self) -> None:
        self.clock_offset = 0.0
        # Real time stands still at this instant while set (`freeze_clock`; a reset thaws it).
        self._frozen_at: float | None = None
        self.faults = Faults()
        self.account = Account()
        # The object the lock_timeout fault holds, once its first refused write named it.
        self._locked_object: str | None = None
        self.sessions: dict[str, Session] = {}
        self.payment_intents: dict[str, PaymentIntent] = {}
        self.charges: dict[str, Charge] = {}
        self.refunds: dict[str, Refund] = {}
        self.endpoints: dict[str, WebhookEndpoint] = {}
        self.events: dict[str, EventRecord] = {}
        self.idempotency: dict[tuple[str, str], StoredResponse] = {}
        self._open_sessions: set[str] = set()
        # PaymentIntents holding an authorization (requires_capture), watched for its lapse.
        self._holds: set[str] = set()
        self._settlements: dict[str, tuple[float, str]] = {}  # session -> (monotonic due, result)
        self._held: list[EventRecord] = []

    def start(self) -> None:
        self.dispatcher.start()
        self._ticker = threading.Thread(target=self._tick_loop, name="stripe-sandbox-ticker", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        self._stop.set()
        self.api_gate.close()
        self.dispatcher.stop()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=2)

    def reset(self) -> None:
        """Forget everything: objects, events, idempotency keys, faults, the clock offset,
        the request log. /v1 calls held by latency or a hang are released.

        Deliveries already queued or in flight belong to the old generation and are dropped.
        """
        with self.lock:
            for event in self.events.values():
                for delivery in event.deliveries:
                    if delivery.status in ("pending", "held"):
                        delivery.status = "abandoned"
                        delivery.abandoned_reason = "sandbox reset"
            self.dispatcher.clear()
            self._clear()
            self.request_log.clear()
        self.api_gate.clear()

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            try:
                with self.lock:
                    self.tick()
            except Exception:  # never let one bad tick stop expiry for good
                log.exception("stripe sandbox tick failed")

    # -- clock -----------------------------------------------------------------------

    def now(self) -> int:
        """The sandbox clock (real time plus every /_sandbox/clock advance), whole seconds."""
        real = time.time() if self._frozen_at is None else self._frozen_at
        return int(real + self.clock_offset)

    def freeze_clock(self) -> int:
        """Stop real time's share of the clock (in-process tests): from now on only an advance
        moves it, so a test can stand one second before a hold's lapse without racing the wall
        clock to the next second. Until `reset`."""
        with self.lock:
            self._frozen_at = time.time()
            return self.now()

    def advance_clock(self, seconds: float) -> int:
        with self.lock:
            self.clock_offset += seconds
            self.tick()
            return self.now()

    def tick(self) -> None:
        """Expire sessions whose time has come and settle due hosted-page async payments."""
        with self.lock:
            now = self.now()
            for session_id in sorted(self._open_sessions, key=lambda i: self.sessions[i].seq):
                session = self.sessions[session_id]
                if now >= session.expires_at:
                    self._expire(session, RequestRef())
            due = [
                (session_id, result) for session_id, (at, result) in self._settlements.items() if at <= time.monotonic()
            ]
            for session_id, result in due:
                self._settlements.pop(session_id, None)
                session = self.sessions.get(session_id)
                if session is not None and self.is_async_pending(session):
                    self.settle_async(session_id, result)
            for pi_id in sorted(self._holds, key=lambda i: self.payment_intents[i].seq):
                pi = self.payment_intents[pi_id]
                if now >= (self.charges[pi.latest_charge or ""].capture_before or now):
                    self._release_hold(pi, "automatic", RequestRef(), lapsed=True)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- checkout sessions -----------------------------------------------------------

    def create_session(
        self,
        *,
        line_items: list[LineItem],
        base_url: str,
        success_url: str | None,
        cancel_url: str | None,
        client_reference_id: str | None,
        customer_email: str | None,
        metadata: dict[str, str],
        payment_intent_metadata: dict[str, str],
        expires_at: int | None,
        locale: str | None = None,
        shipping_countries: list[str] | None = None,
        automatic_tax: bool = False,
        adaptive_pricing: bool = False,
        payment_method_types: list[str] | None = None,
        payment_method_options: dict | None = None,
        capture_method: str = "automatic",
    ) -> Session:
        now = self.now()
        if expires_at is None:
            expires_at = now + SESSION_MAX_SECONDS
        elif expires_at < now + self.min_session_seconds:
            raise invalid(
                "The `expires_at` timestamp must be at least "
                f"{_duration(self.min_session_seconds)} from Checkout Session creation.",
                "expires_at",
            )
        elif expires_at > now + SESSION_MAX_SECONDS:
            raise invalid(
                "The `expires_at` timestamp must be less than 24 hours from Checkout Session creation.",
                "expires_at",
            )
        session_id = new_id("cs_test_a1", 56)
        session = Session(
            id=session_id,
            seq=self._next_seq(),
            created=now,
            expires_at=expires_at,
            currency=line_items[0].currency,
            line_items=line_items,
            pay_url=f"{base_url.rstrip('/')}/pay/{session_id}",
            success_url=success_url,
            cancel_url=cancel_url,
            client_reference_id=client_reference_id,
            customer_email=customer_email,
            metadata=metadata,
            payment_intent_metadata=payment_intent_metadata,
            locale=locale,
            url_withheld=self.faults.checkout_url_null,
            shipping_countries=list(shipping_countries) if shipping_countries else None,
            automatic_tax=automatic_tax,
            tax_status="requires_location_inputs" if automatic_tax else None,
            adaptive_pricing=adaptive_pricing,
            payment_method_types=list(payment_method_types or ["card"]),
            payment_method_options=dict(payment_method_options or {}),
            capture_method=capture_method,
        )
        self.sessions[session.id] = session
        self._open_sessions.add(session.id)
        return session

    def get_session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise no_such("checkout.session", session_id)
        return session

    def expire_session(self, session_id: str, request: RequestRef) -> Session:
        session = self.get_session(session_id)
        if session.status != "open":
            raise state_conflict(
                'Only Checkout Sessions with a status in ["open"] can be expired. This '
                f"Checkout Session has a status of `{session.status}`."
            )
        self._expire(session, request)
        return session

    def _expire(self, session: Session, request: RequestRef) -> None:
        session.status = "expired"
        self._open_sessions.discard(session.id)
        self._settlements.pop(session.id, None)
        pi = self.payment_intents.get(session.payment_intent_id or "")
        if pi is not None and pi.status == "requires_payment_method":
            pi.status = "canceled"
            pi.canceled_at = self.now()
            pi.cancellation_reason = "abandoned"
        self.emit_session("checkout.session.expired", session, request)

    # -- payment outcomes ------------------------------------------------------------

    def apply_outcome(
        self,
        session_id: str,
        outcome: str,
        shipping_details: dict | None = None,
        address: dict | None = None,
    ) -> Session:
        """What the customer did on the hosted page: pay, get declined, or pay later.

        A session that collects a shipping address keeps the one given (already checked by the
        caller: the hosted page's form, or `shipping_problems` for a control call), or, for a
        scripted outcome that gives none, the sandbox's own test address in its first allowed
        country. The customer's `address` (Stripe's six fields), with the shipping address
        before it, says where tax and Adaptive Pricing put them; none given, the sandbox's
        test customer is in its shipping country or else TEST_CUSTOMER_COUNTRY. The payment is
        for the total with the tax. A decline sends `payment_intent.payment_failed`, as Stripe
        does for every failed attempt; the session stays open for another try and no
        checkout.session event is sent."""
        if outcome not in OUTCOMES:
            raise ControlError(400, f"outcome must be one of {', '.join(OUTCOMES)}")
        session = self.sessions.get(session_id)
        if session is None:
            raise ControlError(404, f"No such checkout.session: '{session_id}'")
        if session.status != "open":
            raise ControlError(
                409,
                f"Checkout Session {session_id} is {session.status}; only an open session can take a payment outcome.",
            )
        shipping = shipping_details
        if session.collects_shipping and shipping is None:
            shipping = sandbox_shipping_details(session.shipping_countries[0])
        ships_to = (shipping or {}).get("address")
        # Stripe Tax places the customer where the goods go, else at their billing address.
        self._price(session, (ships_to or address or {}).get("country") or TEST_CUSTOMER_COUNTRY)
        if address is not None or session.automatic_tax:
            session.customer_address = dict(address or _test_address(ships_to))
        pi = self._payment_intent_for(session)
        pi.amount = session.amount_total  # a retry after a decline may be from elsewhere
        charge = self._new_charge(pi)
        if outcome == "declined":
            charge.status = "failed"
            pi.status = "requires_payment_method"
            pi.last_payment_error = dict(DECLINE_ERROR)
            # Still open: the customer may try again. No checkout.session event, as at Stripe.
            self.emit("payment_intent.payment_failed", render_payment_intent(pi), RequestRef(), session_id=session.id)
            return session
        pi.last_payment_error = None
        session.status = "complete"
        if session.collects_shipping:
            session.shipping_details = shipping
        session.customer_details = {
            "address": None,
            "email": session.customer_email or "customer@example.com",
            "name": (session.shipping_details or {}).get("name") or "Sandbox Customer",
            "phone": None,
            "tax_exempt": "none",
            "tax_ids": [],
        }
        self._open_sessions.discard(session.id)
        if outcome == "paid" and pi.card_captures_manually:
            self._hold(pi, charge, RequestRef(), session_id=session.id)
        elif outcome == "paid":
            self._succeed(session, pi, charge)
        else:
            charge.status = "pending"
            pi.status = "processing"
        self.emit_session("checkout.session.completed", session, RequestRef())
        return session

    def _price(self, session: Session, country: str) -> None:
        """The customer is in `country`: their tax (when the session calculates it) and the
        amount Adaptive Pricing shows them in their currency."""
        if session.automatic_tax:
            session.amount_tax = self.account.tax_on(session.amount_subtotal, country)
            session.tax_status = "complete"
        if session.adaptive_pricing:
            shown = presentment(session.amount_total, session.currency, country)
            session.presentment = (
                {"presentment_amount": shown[0], "presentment_currency": shown[1]} if shown is not None else None
            )

    def schedule_async(self, session_id: str, result: str, delay: float) -> None:
        """Settle an async payment later, as the hosted page's "pay later" buttons do."""
        self._settlements[session_id] = (time.monotonic() + delay, result)

    def settle_async(self, session_id: str, result: str) -> Session:
        if result not in ASYNC_RESULTS:
            raise ControlError(400, f"result must be one of {', '.join(ASYNC_RESULTS)}")
        session = self.sessions.get(session_id)
        if session is None:
            raise ControlError(404, f"No such checkout.session: '{session_id}'")
        if not self.is_async_pending(session):
            raise ControlError(
                409,
                f"Checkout Session {session_id} has no pending asynchronous payment "
                f"(status {session.status}, payment_status {session.payment_status}).",
            )
        self._settlements.pop(session_id, None)
        pi = self.payment_intents[session.payment_intent_id]
        charge = self.charges[pi.latest_charge]
        if result == "succeeded":
            self._succeed(session, pi, charge)
            self.emit_session("checkout.session.async_payment_succeeded", session, RequestRef())
        else:
            charge.status = "failed"
            pi.status = "requires_payment_method"
            pi.last_payment_error = dict(ASYNC_FAILURE_ERROR)
            self.emit_session("checkout.session.async_payment_failed", session, RequestRef())
        return session

    def is_async_pending(self, session: Session) -> bool:
        pi = self.payment_intents.get(session.payment_intent_id or "")
        return session.status == "complete" and pi is not None and pi.status == "processing"

    def _payment_intent_for(self, session: Session) -> PaymentIntent:
        """Stripe creates a session's PaymentIntent when the customer first confirms."""
        if session.payment_intent_id:
            return self.payment_intents[session.payment_intent_id]
        pi_id = new_id("pi_3")
        pi = PaymentIntent(
            id=pi_id,
            seq=self._next_seq(),
            created=self.now(),
            amount=session.amount_total,
            currency=session.currency,
            metadata={**session.metadata, **session.payment_intent_metadata},
            session_id=session.id,
            client_secret=f"{pi_id}_secret_{new_id('', 25)}",
            payment_method_types=list(session.payment_method_types),
            capture_method=session.capture_method,
            card_capture_method=(session.payment_method_options.get("card") or {}).get("capture_method"),
        )
        self.payment_intents[pi.id] = pi
        session.payment_intent_id = pi.id
        return pi

    def _new_charge(self, pi: PaymentIntent) -> Charge:
        charge = Charge(
            id=new_id("ch_3"),
            payment_intent_id=pi.id,
            amount=pi.amount,
            currency=pi.currency,
            created=self.now(),
            status="pending",
        )
        self.charges[charge.id] = charge
        pi.latest_charge = charge.id
        pi.payment_method = new_id("pm_1")
        return charge

    @staticmethod
    def _succeed(session: Session, pi: PaymentIntent, charge: Charge) -> None:
        charge.status = "succeeded"
        pi.status = "succeeded"
        pi.amount_received = pi.amount
        pi.last_payment_error = None
        session.payment_status = "paid"

    # -- manual capture --------------------------------------------------------------

    def _hold(self, pi: PaymentIntent, charge: Charge, request: RequestRef, *, session_id: str) -> None:
        """A card payment authorized for a later capture: the charge succeeded uncaptured and
        lapses after the account's `authorization_validity_seconds`; the session stays unpaid,
        as Stripe reports a held payment."""
        charge.status, charge.captured = "succeeded", False
        charge.capture_before = self.now() + self.account.authorization_validity_seconds
        pi.status, pi.amount_capturable = "requires_capture", pi.amount
        self._holds.add(pi.id)
        self.emit("payment_intent.amount_capturable_updated", render_payment_intent(pi), request, session_id=session_id)

    def capture_payment_intent(self, pi_id: str, amount_to_capture: int | None, request: RequestRef) -> PaymentIntent:
        """Take held money: all of it, or `amount_to_capture` (the rest is released, as Stripe
        refunds it to the card). A lapsed hold was canceled by `tick` already."""
        pi = self.get_payment_intent(pi_id)
        if pi.status != "requires_capture":
            raise _unexpected_state(
                pi,
                f"This PaymentIntent could not be captured because it has a status of {pi.status}. "
                "Only a PaymentIntent with one of the following statuses may be captured: requires_capture.",
            )
        amount = pi.amount_capturable if amount_to_capture is None else amount_to_capture
        if amount > pi.amount_capturable:
            raise invalid(
                f"The amount_to_capture ({amount}) must be less than or equal to the PaymentIntent's "
                f"amount_capturable ({pi.amount_capturable}).",
                "amount_to_capture",
                "amount_too_large",
            )
        charge = self.charges[pi.latest_charge or ""]
        charge.captured, charge.amount_captured = True, amount
        charge.amount_refunded = charge.amount - amount
        pi.status, pi.amount_received, pi.amount_capturable = "succeeded", amount, 0
        self._holds.discard(pi.id)
        session = self.sessions.get(pi.session_id)
        if session is not None:
            session.payment_status = "paid"
        self.emit("charge.captured", render_charge(charge), request, session_id=pi.session_id)
        self.emit("payment_intent.succeeded", render_payment_intent(pi), request, session_id=pi.session_id)
        return pi

    def cancel_payment_intent(self, pi_id: str, reason: str | None, request: RequestRef) -> PaymentIntent:
        pi = self.get_payment_intent(pi_id)
        if pi.status not in CANCELLABLE:
            raise _unexpected_state(
                pi,
                f"You cannot cancel this PaymentIntent because it has a status of {pi.status}. Only a "
                f"PaymentIntent with one of the following statuses may be canceled: {', '.join(CANCELLABLE)}.",
            )
        if pi.status != "requires_capture":
            raise _unexpected_state(
                pi,
                "You can only cancel the PaymentIntent of a Checkout Session when it has a status of "
                f"requires_capture; this one is {pi.status}. Expire the Checkout Session "
                f"{pi.session_id} instead.",
            )
        self._release_hold(pi, reason, request, lapsed=False)
        return pi

    def _release_hold(self, pi: PaymentIntent, reason: str | None, request: RequestRef, *, lapsed: bool) -> None:
        """End a hold uncaptured: canceled (`reason` given or None) or lapsed (`automatic`, with
        `charge.expired` first). The uncaptured amount goes back to the card, which Stripe shows
        as the charge refunded."""
        charge = self.charges[pi.latest_charge or ""]
        charge.amount_refunded = charge.amount
        pi.status, pi.amount_capturable = "canceled", 0
        pi.canceled_at, pi.cancellation_reason = self.now(), reason
        self._holds.discard(pi.id)
        if lapsed:
            self.emit("charge.expired", render_charge(charge), request, session_id=pi.session_id)
        self.emit("payment_intent.canceled", render_payment_intent(pi), request, session_id=pi.session_id)

    def get_payment_intent(self, pi_id: str) -> PaymentIntent:
        pi = self.payment_intents.get(pi_id)
        if pi is None:
            raise no_such("payment_intent", pi_id)
        return pi

    # -- refunds ---------------------------------------------------------------------

    def create_refund(
        self,
        *,
        payment_intent_id: str | None,
        charge_id: str | None,
        amount: int | None,
        reason: str | None,
        metadata: dict[str, str],
    ) -> Refund:
        pi = None
        if payment_intent_id is not None:
            pi = self.payment_intents.get(payment_intent_id)
            if pi is None:
                raise no_such("payment_intent", payment_intent_id, "payment_intent", 400)
        if charge_id is not None:
            charge = self.charges.get(charge_id)
            if charge is None:
                raise no_such("charge", charge_id, "charge", 400)
            if pi is not None and charge.payment_intent_id != pi.id:
                raise invalid(f"Charge {charge_id} does not belong to PaymentIntent {pi.id}.", "charge")
            pi = self.payment_intents[charge.payment_intent_id]
            if charge.status != "succeeded":
                raise state_conflict(f"Charge {charge_id} has not succeeded and cannot be refunded.", "charge")
        else:
            assert pi is not None
            charge = self.charges.get(pi.latest_charge or "")
            if charge is None or charge.status != "succeeded":
                raise state_conflict(
                    f"This PaymentIntent ({pi.id}) does not have a successful charge to refund.",
                    "payment_intent",
                )
        if not charge.captured:
            raise state_conflict(
                f"Charge {charge.id} is an uncaptured authorization: capture it, or cancel PaymentIntent "
                f"{pi.id} to release it, instead of refunding it.",
                "charge" if charge_id is not None else "payment_intent",
            )
        remaining = charge.amount - charge.amount_refunded
        if remaining <= 0:
            raise state_conflict(f"Charge {charge.id} has already been refunded.", code="charge_already_refunded")
        if amount is None:
            amount = remaining
        if amount > remaining:
            raise state_conflict(
                f"Refund amount ({format_money(amount, charge.currency)}) is greater than "
                f"unrefunded amount on charge ({format_money(remaining, charge.currency)})",
                "amount",
                "amount_too_large",
            )
        # A pending refund already counts against the charge, as at Stripe: a second refund
        # cannot take the same money while the first may still go through.
        charge.amount_refunded += amount
        refund = Refund(
            id=new_id("re_3"),
            seq=self._next_seq(),
            created=self.now(),
            amount=amount,
            currency=charge.currency,
            charge_id=charge.id,
            payment_intent_id=pi.id,
            metadata=metadata,
            reason=reason,
            status="pending" if self.faults.refunds_pending else "succeeded",
        )
        self.refunds[refund.id] = refund
        return refund

    def settle_refund(self, refund_id: str, outcome: str) -> Refund:
        """The bank's answer to a pending refund. Stripe sends `refund.updated` for every change
        of a refund and `refund.failed` too when it failed; a failed refund's amount is no longer
        refunded, so the charge can be refunded again."""
        if outcome not in REFUND_OUTCOMES:
            raise ControlError(400, f"outcome must be one of {', '.join(REFUND_OUTCOMES)}; got {outcome!r}")
        refund = self.refunds.get(refund_id)
        if refund is None:
            raise ControlError(404, f"No such refund: '{refund_id}'")
        if refund.status != "pending":
            raise ControlError(409, f"Refund {refund_id} is {refund.status}; only a pending refund can be settled.")
        refund.status = outcome
        if outcome == "failed":
            refund.failure_reason = REFUND_FAILURE_REASON
            self.charges[refund.charge_id].amount_refunded -= refund.amount
        body = render_refund(refund)
        self.emit("refund.updated", body, RequestRef(), previous_attributes={"status": "pending"})
        if outcome == "failed":
            self.emit("refund.failed", body, RequestRef())
        return refund

    def get_refund(self, refund_id: str) -> Refund:
        refund = self.refunds.get(refund_id)
        if refund is None:
            raise no_such("refund", refund_id)
        return refund

    # -- webhook endpoints -----------------------------------------------------------

    def create_endpoint(
        self,
        *,
        url: str,
        enabled_events: list[str],
        description: str | None,
        metadata: dict[str, str],
        api_version: str | None,
    ) -> WebhookEndpoint:
        endpoint = WebhookEndpoint(
            id=new_id("we_1"),
            seq=self._next_seq(),
            created=self.now(),
            url=url,
            enabled_events=enabled_events,
            secret=new_id("whsec_", 32),
            description=description,
            metadata=metadata,
            api_version=api_version,
        )
        self.endpoints[endpoint.id] = endpoint
        return endpoint

    def get_endpoint(self, endpoint_id: str) -> WebhookEndpoint:
        endpoint = self.endpoints.get(endpoint_id)
        if endpoint is None:
            raise no_such("webhook_endpoint", endpoint_id)
        return endpoint

    def delete_endpoint(self, endpoint_id: str) -> WebhookEndpoint:
        endpoint = self.get_endpoint(endpoint_id)
        del self.endpoints[endpoint_id]
        return endpoint

    # -- events ----------------------------------------------------------------------

    def get_event(self, event_id: str) -> EventRecord:
        event = self.events.get(event_id)
        if event is None:
            raise no_such("event", event_id)
        return event

    def emit_session(self, event_type: str, session: Session, request: RequestRef) -> EventRecord:
        return self.emit(event_type, render_session(session), request, session_id=session.id)

    def emit(
        self,
        event_type: str,
        data_object: dict,
        request: RequestRef,
        *,
        session_id: str | None = None,
        previous_attributes: dict | None = None,
    ) -> EventRecord:
        """Record an event with a snapshot of its object (a session or a refund, rendered as the
        API renders it) and hand it to delivery. `previous_attributes`: what an `*.updated`
        event's object changed from, as Stripe sends it in `data`.

        Faults apply here, in this order: `drop_webhooks` swallows the whole event for every
        endpoint; `duplicate_webhooks` adds a second delivery per endpoint; while
        `reorder_webhooks` is on, deliveries are held until it is switched off.
        """
        recipients = [e for e in sorted(self.endpoints.values(), key=lambda e: e.seq) if e.wants(event_type)]
        payload = {
            "id": new_id("evt_1"),
            "object": "event",
            "api_version": self.account.default_api_version,
            "created": self.now(),
            "data": {"object": data_object}
            if previous_attributes is None
            else {"object": data_object, "previous_attributes": previous_attributes},
            "livemode": False,
            "pending_webhooks": len(recipients),
            "request": {"id": request.id, "idempotency_key": request.idempotency_key},
            "type": event_type,
        }
        event = EventRecord(
            id=payload["id"],
            seq=self._next_seq(),
            type=event_type,
            created=payload["created"],
            payload=payload,
            body=json.dumps(payload, indent=2).encode("utf-8"),
            session_id=session_id,
        )
        self.events[event.id] = event
        if not recipients:
            return event
        copies = 2 if self.faults.duplicate_webhooks else 1
        for endpoint in recipients:
            for copy in range(copies):
                event.deliveries.append(
                    Delivery(
                        id=new_id("whd_"),
                        event_id=event.id,
                        endpoint_id=endpoint.id,
                        url=endpoint.url,
                        duplicate=copy > 0,
                    )
                )
        if self.faults.drop_webhooks > 0:
            self.faults.drop_webhooks -= 1
            event.dropped = True
            for delivery in event.deliveries:
                delivery.status = "dropped"
        elif self.faults.reorder_webhooks:
            for delivery in event.deliveries:
                delivery.status = "held"
            self._held.append(event)
        else:
            for delivery in event.deliveries:
                self.dispatcher.schedule([delivery], self.faults.webhook_delay_seconds)
        return event

    # -- faults ----------------------------------------------------------------------

    def set_faults(self, changes: dict) -> Faults:
        """Apply a validated subset of fault settings. Switching reorder off releases the
        held events newest-first, one delivery after another."""
        was_reordering = self.faults.reorder_webhooks
        for key, value in changes.items():
            setattr(self.faults, key, value)
        if "lock_timeout" in changes:
            self._locked_object = None
        if was_reordering and not self.faults.reorder_webhooks:
            self._release_held()
        self.api_gate.wake()
        return self.faults

    def _release_held(self) -> None:
        chain: list[Delivery] = []
        for event in reversed(self._held):
            for delivery in event.deliveries:
                if delivery.status == "held":
                    delivery.status = "pending"
                    chain.append(delivery)
        self._held = []
        if chain:
            self.dispatcher.schedule(chain, self.faults.webhook_delay_seconds)

    def lock_timeout(self, target: str | None) -> StripeError | None:
        """The `lock_timeout` fault's answer to a write to the object `target`, or None to go on.
        Its first refused write names the object it holds; writes to others go through, and
        the fault lets go once it has refused its count."""
        if target is None or self.faults.lock_timeout <= 0 or self._locked_object not in (None, target):
            return None
        self.faults.lock_timeout -= 1
        self._locked_object = target if self.faults.lock_timeout > 0 else None
        # Not saved for the Idempotency-Key: nothing ran, so a retry with the same key runs.
        return StripeError(
            429,
            LOCK_TIMEOUT_MESSAGE,
            code="lock_timeout",
            saved=False,
            extra={"doc_url": "https://stripe.com/docs/error-codes/lock-timeout"},
        )

    # -- listing helpers -------------------------------------------------------------

    @staticmethod
    def newest_first(records: Iterable) -> list:
        return sorted(records, key=lambda r: r.seq, reverse=True)


def _unexpected_state(pi: PaymentIntent, message: str) -> StripeError:
    """Stripe's refusal of an action the intent's status does not allow; the error carries the
    intent as it is, as Stripe's does."""
    return StripeError(
        400,
        message,
        code="payment_intent_unexpected_state",
        extra={
            "doc_url": "https://stripe.com/docs/error-codes/payment-intent-unexpected-state",
            "payment_intent": render_payment_intent(pi),
        },
    )


def _test_address(shipping_address: dict | None) -> dict:
    """The sandbox's test customer lives where they ship to, else in TEST_CUSTOMER_COUNTRY."""
    if shipping_address:
        return {key: shipping_address.get(key) for key in ADDRESS_FIELDS}
    return dict(sandbox_shipping_details(TEST_CUSTOMER_COUNTRY)["address"])


def _duration(seconds: int) -> str:
    if seconds == 0:
        return "0 seconds"
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour{'s' if hours != 1 else ''}"
    if seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


__all__ = [
    "ASYNC_RESULTS",
    "ControlError",
    "Faults",
    "HOSTED_ASYNC_SETTLE_SECONDS",
    "OUTCOMES",
    "REFUND_OUTCOMES",
    "RequestRef",
    "Sandbox",
    "StoredResponse",
    "format_money",
]
