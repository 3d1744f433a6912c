"""One webhook receipt, with its evidence (the raw body as received and the address it came
from), and "re-apply" for an event the provider signed: the same dispatch and guarded paths as
the webhook itself (payments.replay), so re-applying an event already applied changes nothing
and says so. Audited like every console POST; asks the operator to confirm first."""

from __future__ import annotations

import logging

from flask import request, url_for

from ..domain.timestamps import iso
from ..extensions import db
from ..models import Order, ReceiptOutcome, WebhookReceipt
from ..payments.replay import NotAnEvent, reapply_event
from ..provider import gateway
from ..web.answers import respond
from . import audit
from .answers import done, operator_name, problem
from .blueprint import bp
from .rows import receipt_json
from .words import REAPPLY_WORDS

log = logging.getLogger("shop.console")


def reapplicable(receipt: WebhookReceipt) -> str | None:
    """Why this receipt cannot be re-applied, or None when it can."""
    if receipt.signed is not True:
        return "Only a delivery whose signature verified can be re-applied: this one's body may be anyone's."
    if not receipt.body:
        return "Its body was not kept (received before the shop kept bodies, or pruned)."
    if receipt.outcome not in (ReceiptOutcome.ACCEPTED, ReceiptOutcome.DUPLICATE, ReceiptOutcome.FAILED):
        return f"A {receipt.outcome} delivery has nothing to re-apply."
    return None


def _receipt_detail(receipt: WebhookReceipt) -> dict:
    reference = (
        db.session.execute(db.select(Order.reference).where(Order.id == receipt.order_id)).scalar()
        if receipt.order_id is not None
        else None
    )
    why_not = reapplicable(receipt)
    return {
        **receipt_json(receipt, reference),
        "body": receipt.body,
        "body_cut_short": bool(receipt.body) and receipt.signed is False,
        "reapplicable": why_not is None,
        "why_not_reapplicable": why_not,
        "received_at": iso(receipt.received_at),
    }


@bp.get("/webhooks/<id:receipt_id>")
def webhook_detail(receipt_id):
    """One received delivery: outcome, reason, the address it came from, whether it was signed
    with the shop's secret, and its raw body; "re-apply" for a signed event."""
    receipt = db.session.get(WebhookReceipt, receipt_id)
    if receipt is None:
        return problem(
            404,
            f"There is no webhook receipt #{receipt_id} (receipts are pruned after RETENTION_DAYS).",
            title="No such webhook receipt",
            back=url_for("console.webhooks"),
        )
    return respond("console/webhook.html", _receipt_detail(receipt))


@bp.post("/webhooks/<id:receipt_id>/reapply")
def reapply_webhook(receipt_id):
    """Apply a received event again through the webhook's own guarded path: form `confirm` must
    be ticked. An event already applied changes nothing, and the answer says so."""
    back = url_for("console.webhook_detail", receipt_id=receipt_id)
    receipt = db.session.get(WebhookReceipt, receipt_id)
    audit.about(f"webhook receipt #{receipt_id}", order_id=receipt.order_id if receipt else None)
    if receipt is None:
        return problem(404, f"There is no webhook receipt #{receipt_id}.", title="No such webhook receipt", back=back)
    why_not = reapplicable(receipt)
    if why_not:
        return problem(409, why_not, title="Cannot re-apply this delivery", back=back)
    if request.form.get("confirm") not in ("yes", "on", "1", "true"):
        return problem(
            400,
            "Tick “apply this event again” to confirm: re-applying can move the order (pay or cancel it).",
            title="Confirm first",
            back=back,
        )
    body, event_id = receipt.body, receipt.event_id
    assert body is not None, "reapplicable() refuses a receipt whose body was not kept"
    db.session.rollback()  # no transaction open across the guarded path (it may ask the provider)
    try:
        result = reapply_event(body)
    except NotAnEvent as exc:
        return problem(409, f"Cannot re-apply: {exc}.", title="Cannot re-apply this delivery", back=back)
    except gateway.ProviderUnavailable as exc:
        return problem(503, f"The payment provider could not be reached ({exc}); nothing changed.", back=back)
    message = f"Event {event_id}: " + (
        REAPPLY_WORDS.get(result.outcome, "{detail}").format(detail=result.detail or result.outcome)
        if not result.changed
        else f"re-applied: {result.outcome}" + (f" ({result.detail})" if result.detail else "") + "."
    )
    log.info("operator %s re-applied webhook receipt #%s (%s): %s", operator_name(), receipt_id, event_id, message)
    return done(
        message,
        {"receipt": receipt_id, "event_id": event_id, "outcome": result.outcome, "changed": result.changed},
        back,
    )
