"""A failed refund's operator actions: send it again (a new attempt at the provider), or record
that it was settled outside the shop; both through `payments.refunds`."""

from __future__ import annotations

import logging

from flask import url_for

from ..domain.timestamps import iso
from ..extensions import db
from ..models import Order, Refund
from ..payments import refund_remedies as refund_cases
from ..web.numbers import whole_number
from . import audit
from .answers import done, operator_name, problem, reason_needed
from .blueprint import bp
from .forms import RetryRefundForm, SettleRefundForm
from .refund_words import refund_action_words

log = logging.getLogger("shop.console")


def _refund_for_action(refund_id: int):
    """(refund, its order's reference, where to go back) for a refund action; refund None when absent."""
    refund = db.session.get(Refund, refund_id)
    order = db.session.get(Order, refund.order_id) if refund is not None else None
    reference = order.reference if order is not None else None
    back = (
        url_for("console.order_detail", reference=reference)
        if reference
        else url_for("console.refunds", status="failed")
    )
    return refund, reference, back


def _refund_answer(action, reference: str | None, back: str):
    """A refund action's answer: 404 / 409 in words, or what the refund is now (JSON, or back)."""
    facts, words = action.refund or {}, refund_action_words(action)
    if action.outcome == refund_cases.ActionOutcome.MISSING:
        return problem(404, words, title="No such refund", back=back)
    if action.outcome == refund_cases.ActionOutcome.REFUSED:
        return problem(
            409,
            words,
            back=back,
            id=facts.get("id"),
            current_status=facts.get("status"),
            attempts=facts.get("attempts"),
        )
    payload = {
        "id": facts["id"],
        "order_reference": reference,
        "status": facts["status"],
        "attempts": facts["attempts"],
        "provider_refund_id": facts["provider_refund_id"],
        "settled_at": iso(facts["settled_at"]),
        "settled_by": facts["settled_by"],
        "reason": facts["settlement_reason"],
        "already": action.outcome == refund_cases.ActionOutcome.ALREADY,
    }
    return done(words, payload, back, "ok" if action.outcome == refund_cases.ActionOutcome.DONE else "warning")


@bp.post("/refunds/<id:refund_id>/retry")
def retry_refund(refund_id):
    """Send a failed refund again: a new attempt at the provider with its own Idempotency-Key
    (form `attempt`: the attempt the operator saw, so a repeated submission retries once)."""
    refund, reference, back = _refund_for_action(refund_id)
    audit.about(
        f"refund {refund_id}" + (f" (order {reference})" if reference else ""),
        order_id=refund.order_id if refund is not None else None,
    )
    form = RetryRefundForm()
    typed = (form.attempt.data or "").strip()
    attempt = whole_number(typed, 1, 1000) if typed else None
    if not form.validate() or typed and attempt is None:
        return problem(
            400,
            "attempt must be the attempt number the refund showed (a whole number from 1).",
            back=back,
            id=refund_id,
        )
    db.session.rollback()  # the use case reads the refund afresh, locked, in its own transaction
    action = refund_cases.retry_refund(refund_id, seen_attempt=attempt)
    if action.outcome == refund_cases.ActionOutcome.DONE:
        log.warning("operator %s sent refund %s again: %s", operator_name(), refund_id, refund_action_words(action))
    return _refund_answer(action, reference, back)


@bp.post("/refunds/<id:refund_id>/settle")
def settle_refund(refund_id):
    """Record, with a reason, that a failed refund was settled outside the shop."""
    refund, reference, back = _refund_for_action(refund_id)
    form = SettleRefundForm()
    reason = (form.reason.data or "").strip()
    audit.about(
        f"refund {refund_id}" + (f" (order {reference})" if reference else ""),
        order_id=refund.order_id if refund is not None else None,
        reason=reason or None,
    )
    if not form.validate() or not reason:
        return reason_needed(form, "Say how this refund was settled outside the shop.", back, id=refund_id)
    operator = operator_name()
    db.session.rollback()
    action = refund_cases.settle_refund(refund_id, reason=reason, operator=operator)
    if action.outcome == refund_cases.ActionOutcome.DONE:
        log.warning("operator %s recorded refund %s as settled outside the shop: %s", operator, refund_id, reason)
    return _refund_answer(action, reference, back)
