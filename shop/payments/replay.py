"""Re-applying a webhook event the shop received (the console's "re-apply", from the receipt's
kept body): the same dispatch as the webhook (shop/webhooks.py `_accept`) through the same
guarded paths, so nothing about a re-apply can do what a redelivery by the provider could not.

A session event goes through `apply.apply_session` with its event id: an event already applied
is found in the dedup table and changes nothing (`duplicate`); a refund's report through
`refunds.apply_refund_report`, which changes nothing for a report already taken (`noop`)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ..provider import gateway
from .apply import apply_session
from .holds import hold_ended, hold_lapsed
from .refunds import apply_refund_report

log = logging.getLogger("shop.payments")

# What the re-apply did that changed nothing (and says so).
UNCHANGED = frozenset({"duplicate", "noop", "unknown_order", "unknown_refund", "not_used"})


@dataclass(frozen=True)
class Reapplied:
    outcome: str
    detail: str = ""
    order_id: int | None = None

    @property
    def changed(self) -> bool:
        return self.outcome not in UNCHANGED


class NotAnEvent(ValueError):
    """The kept body is not an event the shop can apply (cut short, not JSON, no object)."""


def reapply_event(body: str, *, source: str = "console") -> Reapplied:
    try:
        event = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise NotAnEvent(f"the kept body is not JSON ({exc})") from exc
    if not isinstance(event, dict) or not isinstance((event.get("data") or {}).get("object"), dict):
        raise NotAnEvent("the kept body is not a Stripe event")
    event_id, event_type = event.get("id"), event.get("type")
    obj = event["data"]["object"]
    if event_type in gateway.REFUND_EVENT_TYPES:
        view = gateway.refund_view(obj)
        if not view.id:
            return Reapplied("not_used", "the event names no refund")
        report = apply_refund_report(view, source=source)
        return Reapplied(str(report.outcome), report.detail, report.order_id)
    if event_type not in gateway.EVENT_TYPES:
        return Reapplied("not_used", f"event type {event_type} is not used by the shop")
    if event_type in gateway.HOLD_END_EVENT_TYPES or event_type in gateway.HOLD_LAPSE_EVENT_TYPES:
        return _reapply_hold_end(event_type, obj)
    view = gateway.session_view(obj)
    if not view.id:
        return Reapplied("not_used", "the event names no checkout session")
    by_cancel = event_type == "checkout.session.expired" and gateway.expired_by_a_cancel(event)
    if event_type == "checkout.session.expired":
        try:  # as the webhook does: an expiry notice may be stale; what the provider says now wins
            view = gateway.retrieve_session(view.id)
        except (gateway.ProviderUnavailable, gateway.ProviderRefused) as exc:
            log.info("re-apply: could not re-read session %s (%s); using the event's copy", view.id, exc)
    result = apply_session(
        view,
        source=source,
        failed=event_type == "checkout.session.async_payment_failed",
        event_id=event_id,
        expired_by_cancel=by_cancel,
    )
    return Reapplied(str(result.outcome), result.detail, result.order.id if result.order is not None else view.order_id)


def _reapply_hold_end(event_type: str, obj: dict) -> Reapplied:
    """A held payment's end, as the webhook applies it (`holds.hold_ended`, `holds.hold_lapsed`):
    an order it already ended changes nothing."""
    if event_type in gateway.HOLD_LAPSE_EVENT_TYPES:
        intent = obj.get("payment_intent")
        if not isinstance(intent, str) or not intent:
            return Reapplied("not_used", "the charge names no payment")
        news = hold_lapsed(intent, str(obj.get("id") or ""), before_commit=lambda _news: None)
    else:
        news = hold_ended(gateway.payment_view(obj), before_commit=lambda _news: None)
    return Reapplied(news.outcome, news.detail, news.order_id)
