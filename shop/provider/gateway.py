"""The payment gateway: every call the shop makes to the provider (its package, `shop/provider/`,
is the only one that imports `stripe`). What the shop learns from it comes out as plain values
(`views`), every failure as one of `errors`. Every creating call carries an Idempotency-Key
derived from what the call is for, so a retried request (ours, or the SDK's own network retry)
never creates a second object."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote_plus

import stripe

from . import guard

if TYPE_CHECKING:  # the SDK's typed parameters, for the checker only
    from stripe import RequestOptions
    from stripe.params import EventListParams, WebhookEndpointCreateParams, WebhookEndpointUpdateParams
from .checkout_params import session_params
from .errors import (
    BUDGET_KINDS,
    ProviderFailure,
    ProviderRefused,
    ProviderUnavailable,
    SignatureProblem,
    unavailable,
)
from .guarded import guarded_call as _call
from .holds import CHARGE_EXPIRED_FOR_CAPTURE, capture_payment, retrieve_payment, void_payment
from .payment_view import CaptureMethod, Hold, PaymentIntentStatus, PaymentView, payment_view
from .transport import (
    GuardedHttpClient,
    api_base,
    client,
    endpoint_of,
    hosted_page_origins,
)
from .views import (
    CANCEL_EXPIRY_KEY_PREFIX,
    EVENT_TYPES,
    HOLD_END_EVENT_TYPES,
    HOLD_LAPSE_EVENT_TYPES,
    PAYMENT_FAILURE_EVENT_TYPES,
    REFUND_EVENT_TYPES,
    SESSION_EVENT_TYPES,
    EndpointStatus,
    EndpointView,
    PaymentFailureView,
    RefundStatus,
    RefundView,
    SessionEvent,
    SessionPaymentStatus,
    SessionStatus,
    SessionView,
    endpoint_view,
    expired_by_a_cancel,
    payment_failure_view,
    refund_view,
    session_view,
)

__all__ = [
    # What callers name through `gateway`: the provider's objects, its errors, and the transport.
    "BUDGET_KINDS",
    "CANCEL_EXPIRY_KEY_PREFIX",
    "EVENT_TYPES",
    "PAYMENT_FAILURE_EVENT_TYPES",
    "HOLD_END_EVENT_TYPES",
    "HOLD_LAPSE_EVENT_TYPES",
    "payment_view",
    "PaymentFailureView",
    "payment_failure_view",
    "CaptureMethod",
    "Hold",
    "PaymentIntentStatus",
    "PaymentView",
    "CHARGE_EXPIRED_FOR_CAPTURE",
    "capture_payment",
    "retrieve_payment",
    "void_payment",
    "REFUND_EVENT_TYPES",
    "EndpointStatus",
    "EndpointView",
    "GuardedHttpClient",
    "ProviderFailure",
    "ProviderRefused",
    "ProviderUnavailable",
    "RefundStatus",
    "RefundView",
    "SessionEvent",
    "SessionPaymentStatus",
    "SessionStatus",
    "SessionView",
    "SignatureProblem",
    "api_base",
    "client",
    "endpoint_of",
    "expired_by_a_cancel",
    "hosted_page_origins",
    "refund_view",
    "session_view",
]

log = logging.getLogger("shop.payments")


# The two calls of every checkout and every return from the hosted page go through the SDK's
# raw_request (the same requestor, transport, retries, options and error classes as its typed
# services) and are read from the answer's JSON: views.session_view reads a plain dict, and the
# typed services would build a StripeObject tree of the session that session_view only turns
# back into one (about 6% of the web's CPU per paid order, bench/journey_cpu.py).
SESSIONS = "/v1/checkout/sessions"


def _plain(answer: stripe.StripeResponse) -> dict:
    data = answer.data
    return data if isinstance(data, dict) else {}


def create_checkout_session(*, order_id: int, attempt: int, expires_at: datetime, **terms) -> SessionView:
    """The hosted Checkout Session of one payment attempt, asked for as checkout_params.session_params
    spells it (the terms: reference, lines, currency, email, the return URLs, ship_to, tax_mode,
    payment_methods)."""
    params = session_params(order_id=order_id, attempt=attempt, expires_at=expires_at, **terms)
    # The key names the attempt AND the session's end: a network retry of this very call is
    # replayed (same key, same parameters), while a later "Pay now" for an attempt whose save was
    # lost (the session was created, the order's update was not) asks for a later expires_at and
    # must get a new session: the provider refuses a key reused with other parameters, which
    # refused every "Pay now" until the deadline cancelled the order.
    key = f"backstop-order-{order_id}-session-attempt-{attempt}-until-{int(expires_at.timestamp())}"
    if guard.get().line_seen_held():
        raise unavailable(
            "create checkout session: not called: customers are waiting in line for a payment session",
            None,
            guard.ShedKind.LINE,
        )
    session = _call(
        "create checkout session",
        lambda: _plain(client().raw_request("post", SESSIONS, idempotency_key=key, **cast(dict[str, Any], params))),
    )
    return session_view(session)


def retrieve_session(session_id: str) -> SessionView:
    """The session now, with its payment's latest charge expanded: the same one call also says
    how much of the money was refunded (SessionView.amount_refunded)."""
    return session_view(
        _call(
            "retrieve checkout session",
            lambda: _plain(
                client().raw_request(
                    "get", f"{SESSIONS}/{quote_plus(session_id)}", expand=["payment_intent.latest_charge"]
                )
            ),
        )
    )


def expire_session(session_id: str, *, cancelling_order: int | None = None) -> SessionView:
    options: RequestOptions = {}
    if cancelling_order is not None:
        options["idempotency_key"] = f"{CANCEL_EXPIRY_KEY_PREFIX}order-{cancelling_order}-session-{session_id}"
    return session_view(
        _call("expire checkout session", lambda: client().v1.checkout.sessions.expire(session_id, options=options))
    )


EVENTS_PAGE_SIZE = 100  # the most one list call returns


def undelivered_events(*, since: datetime) -> list[tuple[str, str, int]]:
    """The provider's own view of its webhooks: events of the shop's kinds created since `since`
    that it has not delivered (still retrying, or given up), newest first, at most one page:
    (id, type, created). Stripe counts a 4xx from the shop (a wrong signing secret) as a failed
    delivery, so this sees what the shop's own receipts cannot tell from a scanner."""
    params: EventListParams = {
        "delivery_success": False,
        "types": list(EVENT_TYPES),
        "created": {"gte": int(since.timestamp())},
        "limit": EVENTS_PAGE_SIZE,
    }
    events, _ = _events_page("list undelivered events", params)
    return [(e["id"], str(e.get("type")), int(e.get("created") or 0)) for e in events if isinstance(e.get("id"), str)]


def _events_page(what: str, params: EventListParams) -> tuple[list[dict], bool]:
    """One page of the events list, as the provider's JSON (see SESSIONS: a page is up to a hundred
    events, each carrying a whole session, which the SDK's typed list would build into objects
    only to have them read back as dicts), and whether more follow."""
    page = _call(what, lambda: _plain(client().raw_request("get", "/v1/events", **cast(dict[str, Any], params))))
    data = page.get("data")
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else [], page.get("has_more") is True


def session_events(*, since: datetime, starting_after: str | None = None) -> tuple[list[SessionEvent], bool]:
    """One page of the provider's Checkout Session events created since `since`, newest first,
    after the event `starting_after` (the last of the previous page); and whether more follow.
    The provider keeps events for 30 days."""
    params: EventListParams = {
        "types": list(SESSION_EVENT_TYPES),
        "created": {"gte": int(since.timestamp())},
        "limit": EVENTS_PAGE_SIZE,
    }
    if starting_after:
        params["starting_after"] = starting_after
    events, more = _events_page("list events", params)
    return _session_events_of(events), more


def _session_events_of(events: list[dict]) -> list[SessionEvent]:
    found = []
    for data in events:
        obj = (data.get("data") or {}).get("object")
        if isinstance(obj, dict) and isinstance(data.get("id"), str):
            found.append(
                SessionEvent(
                    data["id"],
                    str(data.get("type")),
                    int(data.get("created") or 0),
                    session_view(obj),
                    expired_by_a_cancel(data),
                    obj,
                )
            )
    return found


def create_refund(
    *,
    order_id: int,
    session_id: str,
    payment_intent: str,
    amount: int,
    reason: str,
    attempt: int = 1,
    refund_id: int | None = None,
) -> RefundView:
    """One refund at the provider per (order, session, attempt): a retry of the same attempt is
    replayed, a new attempt (after the last one failed) refunds again. The first attempt keeps
    the key and metadata refunds had before attempts existed, so a command re-run across a
    deploy is still a replay and not an idempotency error. An operator's refund (`refund_id`)
    is one of possibly several of the same session: its key and metadata name the refund."""
    key = f"backstop-refund-order-{order_id}-session-{session_id}"
    metadata = {"order_id": str(order_id), "session_id": session_id, "reason": reason}
    if refund_id is not None:
        key = f"backstop-refund-{refund_id}-order-{order_id}"
        metadata["refund_id"] = str(refund_id)
    if attempt > 1 or refund_id is not None:
        key += f"-attempt-{attempt}"
        metadata["attempt"] = str(attempt)
    refund = _call(
        "create refund",
        lambda: client().v1.refunds.create(
            params={"payment_intent": payment_intent, "amount": amount, "metadata": metadata},
            options={"idempotency_key": key},
        ),
    )
    return refund_view(refund)


def refund_unknown_payment(*, session_id: str, payment_intent: str, amount: int) -> RefundView:
    """Give back money the provider holds for a session of this shop's that names no order the
    database knows (shop.payments.unknown_money): one refund per session, whatever retries."""
    refund = _call(
        "create refund",
        lambda: client().v1.refunds.create(
            params={
                "payment_intent": payment_intent,
                "amount": amount,
                "metadata": {"session_id": session_id, "reason": "payment for an order this shop does not know"},
            },
            options={"idempotency_key": f"backstop-refund-unknown-session-{session_id}"},
        ),
    )
    return refund_view(refund)


def paid_session_events(*, since: datetime, until: datetime, starting_after: str | None = None):
    """One page (newest first) of the provider's events for sessions that took money, created in
    [since, until): what the sweep's scan for unknown money reads. Returns (events, more)."""
    params: EventListParams = {
        "types": ["checkout.session.completed", "checkout.session.async_payment_succeeded"],
        "created": {"gte": int(since.timestamp()), "lt": int(until.timestamp())},
        "limit": EVENTS_PAGE_SIZE,
    }
    if starting_after:
        params["starting_after"] = starting_after
    events, more = _events_page("list events", params)
    return _session_events_of(events), more


def refunds_of_payment(payment_intent: str) -> list[RefundView]:
    """The provider's refunds of one payment (its first 100: a payment has one or a few)."""
    page = _call(
        "list refunds",
        lambda: client().v1.refunds.list(params={"payment_intent": payment_intent, "limit": 100}),
    )
    return [refund_view(r) for r in page.data]


def refunds_since(since: datetime) -> list[RefundView]:
    """Every refund created since `since`, page by page (100 a page): the sweep's one look at what
    was given back, beside the events it reads in bulk."""
    params = {"created": {"gte": int(since.timestamp())}, "limit": 100}
    page = _call("list refunds", lambda: client().v1.refunds.list(params=cast("Any", params)))
    return [refund_view(r) for r in _call("list refunds", lambda: list(page.auto_paging_iter()))]


def retrieve_refund(refund_id: str) -> RefundView:
    return refund_view(_call("retrieve refund", lambda: client().v1.refunds.retrieve(refund_id)))


# Webhook endpoint registration -------------------------------------------------------------


# EVENT_TYPES are plain strings (views does not import the SDK), a subset of the event
# types the SDK spells as one Literal: the endpoint's parameters are cast to its TypedDicts.


def list_webhook_endpoints() -> list[EndpointView]:
    page = _call("list webhook endpoints", lambda: client().v1.webhook_endpoints.list(params={"limit": 100}))
    return [endpoint_view(e) for e in page.auto_paging_iter()]


# The API version the SDK is pinned to: our endpoint renders its events in it, so an event reads
# as the objects the SDK returns do, whatever the account's default version is.
SDK_API_VERSION: str = stripe.api_version


def create_webhook_endpoint(url: str, description: str) -> EndpointView:
    params = {"url": url, "enabled_events": EVENT_TYPES, "description": description, "api_version": SDK_API_VERSION}
    return endpoint_view(
        _call(
            "create webhook endpoint",
            lambda: client().v1.webhook_endpoints.create(params=cast("WebhookEndpointCreateParams", params)),
        )
    )


def subscribe_webhook_endpoint(endpoint_id: str) -> EndpointView:
    """Our endpoint, registered by an earlier release, made to send every event this one uses."""
    return endpoint_view(
        _call(
            "update webhook endpoint",
            lambda: client().v1.webhook_endpoints.update(
                endpoint_id, params=cast("WebhookEndpointUpdateParams", {"enabled_events": EVENT_TYPES})
            ),
        )
    )


def delete_webhook_endpoint(endpoint_id: str) -> None:
    _call("delete webhook endpoint", lambda: client().v1.webhook_endpoints.delete(endpoint_id))


def answered_last() -> bool:
    """The breaker's verdict, without a call: closed, with no failure since the provider last
    answered (the probe that closed it after an outage, or any call since)."""
    view = guard.get().breaker_view()
    return view["state"] == guard.BreakerState.CLOSED and view["failures"] == 0


def answers() -> None:
    """Does the provider take calls now? One cheap read (the newest event) through the guard:
    raises ProviderUnavailable when it does not (down, or its breaker open), ProviderRefused
    when it answered no (which is an answer: it is up)."""
    _call("list events", lambda: client().v1.events.list(params={"limit": 1}))


def payment_intent_failed(payment_intent_id: str) -> bool:
    intent = _call("retrieve payment intent", lambda: client().v1.payment_intents.retrieve(payment_intent_id))
    return intent["status"] in ("requires_payment_method", "canceled")
