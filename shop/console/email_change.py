"""An order's address corrected by an operator (docs/REFERENCE.md, Console): the new address
checked as the checkout checks it, the old and the new in the audit trail (the action's outcome),
and the order's later emails sent to the new one (orders.contact)."""

from __future__ import annotations

from wtforms import HiddenField, TextAreaField
from wtforms.validators import DataRequired, Length, Optional

from ..orders import contact
from ..web.answers import respond
from ..web.requests import email_field
from .answers import audited_order, done, no_order, of_order, order_page, problem
from .blueprint import bp
from .forms import ConsoleForm


class ChangeEmailForm(ConsoleForm):
    email = email_field("New email", DataRequired(message="Enter the order's new email address."))
    reason = TextAreaField(
        "Why", validators=[Optional(), Length(max=2000, message="Keep the reason under 2000 characters.")]
    )
    next = HiddenField()


@bp.get("/orders/<reference>/email")
@of_order
def change_email_form(order):
    """The form: the order's address now, the new one and why. Nothing changes on a GET."""
    data = {"reference": order.reference, "email": order.email}
    return respond("console/change_email.html", data, form=ChangeEmailForm(), back=order_page(order))


@bp.post("/orders/<reference>/email")
def change_email(reference):
    """Replace the order's address; the outcome, in the audit trail, names the old and the new."""
    form = ChangeEmailForm()
    order = audited_order(reference, "email of order", (form.reason.data or "").strip() or None)
    if order is None:
        return no_order(reference)
    back = order_page(order)
    if not form.validate():
        words = form.email.errors[0] if form.email.errors else f"Why: {form.reason.errors[0]}"
        return problem(400, str(words), back=back)
    new = (form.email.data or "").strip()
    if new == order.email:
        return problem(409, f"{new} is already this order's address; nothing changed.", back=back)
    changed = contact.change_email(order.id, new)
    if changed.old is None:
        return no_order(reference)
    message = f"Order {order.reference}'s emails now go to {new} (was {changed.old})."
    return done(message, {"reference": order.reference, "email": new, "previous_email": changed.old}, back)
