"""An operator's cancel of an order (docs/REFERENCE.md, Console: POST /console/orders/<ref>/cancel):
asked, with the reason, then done through the customer's own use case (`orders.cancel`), so a live
order's payment page is retired first and an Authorized order's hold is voided, never refunded;
the compensation gives the stock back as for any cancel."""

from __future__ import annotations

from wtforms import HiddenField

from ..domain.order import LIVE, OrderStatus
from ..orders.cancel import CancelStatus, cancel_order
from ..web.answers import respond
from .answers import audited_order, done, no_order, of_order, order_page, problem, reason_needed
from .blueprint import bp
from .forms import ConsoleForm, _reason_field

# The OrderCancelled reason an operator's cancel carries (no customer email: "other").
BY_OPERATOR = "cancelled by an operator: {reason}"


class CancelOrderForm(ConsoleForm):
    reason = _reason_field("Why cancel it", "Say why the order is cancelled: the reason is kept in the audit trail.")
    next = HiddenField()


def _cancellable(order) -> bool:
    return order.status in LIVE or (order.status is OrderStatus.AUTHORIZED and order.capture_requested_at is None)


@bp.get("/orders/<reference>/cancel")
@of_order
def cancel_order_form(order):
    """The confirmation step, with the reason to give. Nothing changes on a GET."""
    data = {"reference": order.reference, "status": order.status.value, "cancellable": _cancellable(order)}
    return respond("console/cancel_order.html", data, form=CancelOrderForm(), back=order_page(order))


@bp.post("/orders/<reference>/cancel")
def cancel_order_now(reference):
    """Cancel a live or Authorized order with the operator's reason."""
    form = CancelOrderForm()
    reason = (form.reason.data or "").strip()
    order = audited_order(reference, "order", reason or None)
    if order is None:
        return no_order(reference)
    ref, back = order.reference, order_page(order)
    if not form.validate():
        return reason_needed(form, "Say why the order is cancelled.", back)
    held = order.status is OrderStatus.AUTHORIZED
    outcome = cancel_order(order.id, None, reason=BY_OPERATOR.format(reason=reason[:500]))
    if outcome.status is CancelStatus.NOT_FOUND:
        return no_order(reference)
    if outcome.status is not CancelStatus.CANCELLED:
        now = outcome.order.status.value if outcome.order else "changed"
        words = outcome.message or f"the order is {now}"
        return problem(409, f"Order {ref} was not cancelled: {words}.", title="Not cancelled", back=back,
                       reference=ref, order_status=now)  # fmt: skip
    money = " Its held payment is being voided (nothing was taken)." if held else ""
    message = f"Order {ref} cancelled; its stock goes back in a moment.{money}"
    return done(message, {"reference": ref, "status": OrderStatus.CANCELLED.value, "voided": held}, back)
