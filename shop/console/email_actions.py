"""An order's emails in the console: every email the order was sent, and one sent again after a
confirmation (`saga.email_resends.resend_email`), once per submission: the form carries a
`request_key` made when the confirmation was shown."""

from __future__ import annotations

from flask import request, url_for
from wtforms import HiddenField
from wtforms.validators import Optional

from ..domain.deadlines import utcnow
from ..domain.timestamps import iso
from ..extensions import db
from ..saga import email_resends
from ..web.answers import respond
from ..web.requests import email_field
from . import audit
from .answers import done, find_order, no_order, of_order, operator_name, problem
from .blueprint import bp
from .forms import ConsoleForm
from .money_actions import KEY, new_request_key


class ResendForm(ConsoleForm):
    template = HiddenField()
    request_key = HiddenField()
    # "Send to another address": empty or the order's own sends it to the order's address.
    to = email_field("Send to", Optional())
    next = HiddenField()


@bp.get("/orders/<reference>/emails")
@of_order
def order_emails(order):
    """Every email the order was sent, each with a link to send it again (after a confirmation)."""
    sent = email_resends.sent_emails(order.id)
    data = {
        "reference": order.reference,
        "email": order.email,
        "emails": [
            {
                "template": e.template,
                "name": e.name,
                "sent_at": iso(e.sent_at),
                "via": e.via,
                "work_id": e.work_id,
                "resent_by": e.resent_by,
            }
            for e in sent
        ],
    }
    return respond("console/order_emails.html", data, order=order)


@bp.get("/orders/<reference>/emails/resend")
@of_order
def confirm_resend(order):
    """The confirmation step before an email goes out again: which email, to whom, and that it is
    rendered from the order as it is now. Nothing is sent on a GET."""
    back = url_for("console.order_emails", reference=order.reference)
    template = (request.args.get("template") or "").strip()
    name = email_resends.EMAIL_NAMES.get(template)
    if name is None:
        return _not_an_email(back)
    sent = [e for e in email_resends.sent_emails(order.id) if e.template == template]
    if not sent:
        return problem(409, RESEND_WORDS["not_sent"].format(name=name), title="Not sent", back=back, why="not_sent")
    data = {
        "reference": order.reference,
        "email": order.email,
        "template": template,
        "name": name,
        "times_sent": len(sent),
        "last_sent_at": iso(max((e.sent_at for e in sent if e.sent_at), default=None)),
        "step": "confirm",
    }
    return respond("console/resend_email.html", data, request_key=new_request_key(), back=back)


RESEND_WORDS = {
    "not_sent": "This order was never sent the {name} email, so there is nothing to send again.",
    "no_longer_true": (
        "The {name} email is no longer true for this order (it has moved on since), so it is not sent again."
    ),
}


@bp.post("/orders/<reference>/emails/resend")
def resend_email(reference):
    """Send one of the order's emails again, through the mail sending path (once per submission)."""
    order = find_order(reference)
    form = ResendForm()
    template = (form.template.data or "").strip()
    to = (form.to.data or "").strip()
    to = None if order is None or to.lower() == order.email.lower() else to or None
    audit.about(
        f"{template or 'email'} email of order {order.reference if order else reference}"
        + (f" to another address ({to})" if to else ""),
        order_id=order and order.id,
    )
    if order is None:
        return no_order(reference)
    back = url_for("console.order_emails", reference=order.reference)
    name = email_resends.EMAIL_NAMES.get(template)
    if name is None:
        return _not_an_email(back)
    if to and not form.to.validate(form):
        return problem(400, f"Send to: {form.to.errors[0]}", back=back)
    key = form.request_key.data or ""
    if not KEY.fullmatch(key):
        return problem(
            400, "This form has no valid request key: open the order's emails again and send from there.", back=back
        )
    db.session.rollback()
    result = email_resends.resend_email(
        order.id, template, operator=operator_name(), request_key=key, now=utcnow(), to=to
    )
    if result.outcome is email_resends.ResendOutcome.REFUSED:
        assert result.why is not None, "a refused resend says why"
        return problem(409, RESEND_WORDS[result.why].format(name=name), title="Not sent", back=back, why=result.why)
    if result.outcome is email_resends.ResendOutcome.MISSING:
        return no_order(reference)
    already = result.outcome is email_resends.ResendOutcome.ALREADY
    message = (
        f"The {name} email was already sent again for this click; it is not sent twice."
        if already
        else f"The {name} email is on its way to {to or order.email} again."
    )
    payload = {
        "reference": order.reference,
        "template": template,
        "command_id": result.command_id,
        "already": already,
        "to": to or order.email,
    }
    return done(message, payload, back, "warning" if already else "ok")


def _not_an_email(back: str):
    """The refusal of a template that names none of the emails an order can be sent again."""
    names = ", ".join(email_resends.EMAIL_NAMES)
    return problem(400, f"Choose one of the order's emails to send again ({names}).", back=back)
