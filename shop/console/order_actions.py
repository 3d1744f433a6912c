"""One order's repairs: the reconcile button (ask the provider now, apply the answer through the
same guarded transition as the webhook and the sweep), and a restore warning resolved by hand or by
running the compensation again (`saga.warnings`)."""

from __future__ import annotations

import logging

from flask import url_for

from ..domain.deadlines import utcnow
from ..extensions import db
from ..models import Order, RestoreWarning, WarningState
from ..payments.apply import Outcome, reconcile_order
from ..provider import gateway
from ..saga import warnings
from . import audit
from .answers import done, find_order, no_order, operator_name, problem
from .blueprint import bp
from .forms import ResolveForm

log = logging.getLogger("shop.console")


RECONCILE_WORDS = {
    "paid": "The provider confirms the payment: the order is now Paid.",
    "payment_failed": "The provider says the payment did not go through: the order is now PaymentFailed "
    "(its items stay held for a fresh payment window).",
    "cancelled": "The payment page expired at the end of the payment window: the order is now Cancelled and "
    "its stock is being given back.",
    "refund_created": "The provider holds money this order cannot take ({detail}); a refund is queued.",
    "already_refunded": "The provider holds money this order cannot take ({detail}); the refund was already "
    "on record, nothing more was queued.",
    "awaiting_async": "The customer finished checkout but the payment is still processing at the provider. "
    "Nothing to change yet; the webhook or the sweep will settle it.",
    "proof_refused": "The provider's payment does not match this order ({detail}); the order was left as it "
    "was. Check the payment at the provider.",
    "authorized": "The provider holds the payment: the order is now Authorized; it is captured when it ships.",
    "void_created": "The provider holds money this order cannot take ({detail}); a void of the hold is queued.",
    "noop": "Nothing to change: {detail}.",
    "duplicate": "Already applied; nothing to change.",
    "unknown_order": "The provider's session does not name this order ({detail}); nothing changed.",
}


CALM = (Outcome.NOOP, Outcome.DUPLICATE, Outcome.AWAITING_ASYNC)


@bp.post("/orders/<reference>/reconcile")
def reconcile(reference):
    """Ask the provider about the order's payment now and apply the answer through the same
    guarded transition as the webhook and the sweep."""
    order = find_order(reference)
    back = url_for("console.order_detail", reference=reference)
    if order is None:
        return no_order(reference, back)
    order_id, ref, before = order.id, order.reference, order.status
    audit.about(f"order {ref}", order_id=order_id)
    try:
        applied = reconcile_order(order_id, source="console")
    except gateway.ProviderUnavailable as exc:
        log.warning("operator %s: reconcile of %s: provider unreachable: %s", operator_name(), ref, exc)
        return problem(
            503,
            f"The payment provider could not be reached, so nothing changed: order {ref} is still "
            f"{before}. Try again in a minute; the reconciliation sweep keeps asking too.",
            title="Payment provider unreachable",
            back=back,
            reference=ref,
            order_status=before,
        )
    except gateway.ProviderRefused as exc:
        log.warning("operator %s: reconcile of %s: provider refused: %s", operator_name(), ref, exc)
        return problem(
            502,
            f"The payment provider refused to answer about order {ref}'s payment session ({exc}). Nothing changed.",
            title="Payment provider refused",
            back=back,
            reference=ref,
            order_status=before,
        )
    db.session.rollback()
    after = db.session.get(Order, order_id)
    assert after is not None, "the shop deletes no order"
    now_status = after.status
    message = f"Order {ref}: " + RECONCILE_WORDS.get(applied.outcome, "{detail}").format(detail=applied.detail)
    log.info(
        "operator %s reconciled order %s: %s (%s -> %s)", operator_name(), ref, applied.outcome, before, now_status
    )
    return done(
        message,
        {
            "reference": ref,
            "outcome": applied.outcome,
            "detail": applied.detail,
            "status_before": before,
            "status": now_status,
        },
        back,
        "ok" if applied.outcome in (Outcome.PAID, Outcome.AUTHORIZED, *CALM) else "warning",
    )


@bp.post("/restore-warnings/<id:warning_id>/resolve")
def resolve_warning(warning_id):
    """`action=fixed`: the operator fixed the stock by hand; the warning closes with a note.
    `action=retry`: run the compensation again; the warning closes only if the order's stock
    is now restored, otherwise it stays open with what happened (saga.warnings)."""
    back = url_for("console.restore_warnings", state="open")
    warning = db.session.get(RestoreWarning, warning_id)
    if warning is None:
        return problem(404, f"There is no restore warning {warning_id}.", title="No such warning", back=back)
    form = ResolveForm()
    action = (form.action.data or "").strip()
    audit.about(
        f"restore warning {warning_id} ({action or 'no action'})",
        order_id=warning.order_id,
        reason=(form.note.data or "").strip() or None,
    )
    if action not in ("fixed", "retry") or not form.validate():
        return problem(
            400,
            "Choose action “fixed” (you corrected the stock by hand) or “retry” (run the "
            "restore again); keep the note under 2000 characters.",
            back=back,
            id=warning_id,
        )
    if warning.state != WarningState.OPEN:
        return problem(
            409,
            f"Restore warning {warning_id} is already {warning.state}: {warning.resolution or ''}",
            back=back,
            id=warning_id,
            state=warning.state,
        )
    now = utcnow()
    stamp = f"{now:%Y-%m-%d %H:%M} UTC, {operator_name()}"
    if action == "fixed":
        return _fixed_by_hand(warning_id, stamp, (form.note.data or "").strip(), now, back)
    return _retry_restore(warning_id, stamp, now, back)


def _fixed_by_hand(warning_id: int, stamp: str, note: str, now, back: str):
    db.session.rollback()
    if not warnings.resolve_fixed_by_hand(warning_id, stamp, note, now):
        return problem(409, f"Restore warning {warning_id} was settled meanwhile.", back=back, id=warning_id)
    log.info("operator %s resolved restore warning %s as fixed by hand", operator_name(), warning_id)
    return done(
        f"Restore warning {warning_id} resolved: stock fixed by hand.",
        {"id": warning_id, "state": "resolved", "outcome": "fixed"},
        back,
    )


def _retry_restore(warning_id: int, stamp: str, now, back: str):
    result = warnings.retry_restore(warning_id, stamp, now)
    if result.lost:
        return problem(409, f"Restore warning {warning_id} was settled meanwhile.", back=back, id=warning_id)
    if result.resolved:
        log.info("operator %s: restore retry resolved warning %s (%s)", operator_name(), warning_id, result.outcome)
        return done(
            f"Restore warning {warning_id} resolved: {result.words}.",
            {"id": warning_id, "state": "resolved", "outcome": result.outcome},
            back,
            "warning" if result.fresh else "ok",
        )
    log.warning("operator %s: restore retry left warning %s open: %s", operator_name(), warning_id, result.words)
    return done(
        f"Restore warning {warning_id} is still open: {result.words}.",
        {"id": warning_id, "state": "open", "outcome": _outcome_words(result), "detail": result.words},
        back,
        "warning",
    )


def _outcome_words(result) -> str:
    """The compensation's word, with what went wrong when the retry raised (as the console has
    always said it: "error (Type: message)")."""
    return f"{result.outcome} ({result.error})" if result.error else str(result.outcome)
