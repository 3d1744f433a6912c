"""An order's money actions: refund a paid order in full or in part (asked, then confirmed, then
done by `saga.operator_refunds.refund_order`). Each form carries a `request_key` made when the page
was shown: the same submission sent twice acts once (email_actions.py and stock_pages.py use the
same keys)."""

from __future__ import annotations

import hashlib
import re
import secrets
from decimal import Decimal

from flask import request, url_for
from sqlalchemy import select
from wtforms import HiddenField, StringField, TextAreaField

from ..domain.deadlines import utcnow
from ..domain.timestamps import iso
from ..extensions import db
from ..models import Refund
from ..money import format_money, minor_digits
from ..saga.line_restock import lines_left
from ..saga.operator_refunds import RefundOutcome, refund_order, refundable_now
from ..web.answers import respond
from . import audit
from .answers import done, find_order, no_order, of_order, operator_name, problem
from .blueprint import bp
from .forms import ConsoleForm
from .restock_form import asked_lines, asked_words, field

KEY = re.compile(r"[A-Za-z0-9_-]{16,64}")
MINOR = re.compile(r"[0-9]{1,10}")
DECIMAL_AMOUNT = re.compile(r"[0-9]{1,12}(\.[0-9]{0,6})?|\.[0-9]{1,6}")
YES, NO = ("yes", "y", "1", "on", "true"), ("no", "n", "0", "off", "false", "")


def yes_or_no(value) -> bool | None:
    """A form's yes/no (a checkbox sends `y`; a script `yes` or `no`): None when it is neither."""
    if isinstance(value, bool):
        return value
    text = str(value or "").strip().lower()
    return True if text in YES else False if text in NO else None


def submission_key(*parts) -> str:
    """A submission's key when its form carried none (a script): the same refund asked twice by the
    same operator (same amount, reason and restock) is made once."""
    digest = hashlib.sha256("|".join(map(str, (operator_name(), *parts))).encode()).hexdigest()
    return f"auto-{digest[:40]}"


def new_request_key() -> str:
    """The key a form carries from the page that showed it to the action it posts."""
    return secrets.token_urlsafe(24)


class RefundForm(ConsoleForm):
    # Checked in the view, so each mistake gets words that say what to type.
    amount = StringField("Amount")
    reason = TextAreaField("Reason")
    restock = StringField("Put the stock back")  # yes or no
    request_key = HiddenField()
    next = HiddenField()


def parse_amount(text: str | None, currency: str) -> tuple[int | None, str | None]:
    """An amount as an operator types it ("12.50", "12", "1,500") -> (minor units, None), or
    (None, what is wrong in words)."""
    raw = (text or "").strip().replace(",", "")
    digits = minor_digits(currency)
    if not raw:
        return None, "Enter the amount to refund."
    # ASCII digits and one point only: Decimal would also take "1e999999" (whose scaling
    # overflows) and other scripts' digits.
    if not DECIMAL_AMOUNT.fullmatch(raw):
        return None, f"{(text or '')[:30]!r} is not an amount: type it like {format_example(currency)}."
    minor = Decimal(raw).scaleb(digits)
    if minor != minor.to_integral_value():
        return None, f"{currency.upper()} amounts have {digits} decimal places at most."
    if minor <= 0:
        return None, "The amount to refund must be more than zero."
    if minor >= 2**31:
        return None, "That amount is larger than any order."
    return int(minor), None


def format_example(currency: str) -> str:
    digits = minor_digits(currency)
    return "12" if digits == 0 else "12." + "5".ljust(digits, "0")


def major(amount: int, currency: str) -> str:
    """Minor units -> the plain number typed in the form ("12.50")."""
    return f"{Decimal(amount).scaleb(-minor_digits(currency)):f}"


REFUSAL_WORDS = {
    "not_paid": "Only a paid order can be refunded here; this order is {status}.",
    "no_payment": "This order has no payment to refund.",
    "not_positive": "The amount to refund must be more than zero.",
    "nothing_left": "Nothing is left to refund: this order's payment has been refunded in full.",
    "over_refundable": "{amount} is more than is left to refund: at most {left}.",
    "no_reason": "Say why the order is refunded: the reason is kept with the refund and in the audit trail.",
    "already_restocked": (
        "This order's stock was already put back (with an earlier refund); refund without putting the stock back."
    ),
    "restock_refused": "The stock could not be put back, so nothing was refunded: {restock}.",
}


def refusal_words(why: str, currency: str, *, amount=None, left=None, status=None, restock="") -> str:
    return REFUSAL_WORDS[why].format(
        amount=format_money(amount, currency),
        left=format_money(left, currency),
        status=status,
        restock=restock,
    )


def _restock_asked(form, order_id: int) -> tuple[bool | dict[int, int], str | None]:
    """The units to put back by line (the form's `restock_<line id>`), else `restock` yes/no."""
    _lines, wanted, error = asked_lines(request.form, order_id)
    if error is not None or wanted:
        return wanted, error
    restock = yes_or_no(form.restock.data)
    if restock is None:
        return False, "restock must be yes or no, or give the units of each line (restock_<line id>)."
    return restock, None


def _key_part(restock: bool | dict[int, int]) -> str:
    return ",".join(f"{line}:{n}" for line, n in sorted(restock.items())) if isinstance(restock, dict) else str(restock)


def _refund_page(order, *, step: str, status: int = 200, error: str | None = None, restock=None, **extra):
    left = refundable_now(order.id)
    restock = restock or {}
    refunds = db.session.execute(select(Refund).where(Refund.order_id == order.id).order_by(Refund.id)).scalars()
    data = {
        "reference": order.reference,
        "status": order.status.value,
        "total": order.total,
        "currency": order.currency,
        "refundable": left,
        "inventory_restored": order.inventory_restored,
        "refunds": [
            {
                "id": r.id,
                "amount": r.amount,
                "status": r.status,
                "reason": r.reason,
                "by": r.requested_by,
                "restock": r.restock,
                "at": iso(r.created_at),
            }
            for r in refunds
        ],
        "lines": [
            {
                "id": ln.id,
                "sku": ln.sku,
                "name": ln.name,
                "quantity": ln.quantity,
                "restocked": ln.restocked,
                "left": ln.left,
                "restock": restock.get(ln.id, 0),
            }
            for ln in lines_left(order.id)
        ],
        "step": step,
        "error": error,
        **extra,
    }
    return respond(
        "console/refund_order.html",
        data,
        status,
        order=order,
        example=format_example(order.currency),
        field=field,
        restock_fields={field(line): n for line, n in restock.items()},
        # The form's mistake is said beside the form (the layout's own line stays out).
        error_field="amount" if error and step == "form" else None,
    )


@bp.get("/orders/<reference>/refund")
@of_order
def refund_form(order):
    """Refund a paid order: the form (amount, reason, whether to put the stock back), then, with
    the form's values in the query, the confirmation step whose button posts the refund."""
    left = refundable_now(order.id)
    if left is None:
        return _refund_page(
            order,
            step="refused",
            status=409,
            error=refusal_words(
                "not_paid" if order.payment_session_id else "no_payment", order.currency, status=order.status.value
            ),
        )
    if left <= 0:
        return _refund_page(order, step="refused", status=409, error=refusal_words("nothing_left", order.currency))
    text, reason = request.args.get("amount", ""), (request.args.get("reason") or "").strip()[:200]
    lines, wanted, restock_error = asked_lines(request.args, order.id)
    if "amount" not in request.args or request.args.get("edit"):
        # The form: empty, or again with what the confirmation step showed ("No, change it").
        return _refund_page(
            order, step="form", amount=text[:40] or major(left, order.currency), reason=reason, restock=wanted
        )
    amount, error = parse_amount(text, order.currency)
    error = error or restock_error
    if amount is not None and amount > left:  # parse_amount gives an amount or an error, never both
        error = refusal_words("over_refundable", order.currency, amount=amount, left=left)
    if error is None and not reason:
        error = refusal_words("no_reason", order.currency)
    if error is not None:
        return _refund_page(
            order, step="form", status=400, error=error, amount=text[:40], reason=reason, restock=wanted
        )
    assert amount is not None, "parse_amount gives an amount whenever it finds no error"
    return _refund_page(
        order,
        step="confirm",
        amount=major(amount, order.currency),
        amount_minor=amount,
        reason=reason,
        restock=wanted,
        restock_words=asked_words(lines, wanted),
        left_after=left - amount,
        request_key=new_request_key(),
    )


@bp.post("/orders/<reference>/refund")
def refund(reference):
    """Refund (part of) a paid order at the provider, once per submission, and put its stock back
    if asked: what the confirmation step posts."""
    order = find_order(reference)
    back = url_for("console.order_detail", reference=order.reference) if order else url_for("console.orders")
    form = RefundForm()
    reason = (form.reason.data or "").strip()
    audit.about(
        f"order {reference}" if order is None else f"order {order.reference}",
        order_id=order and order.id,
        reason=reason or None,
    )
    if order is None:
        return no_order(reference, back)
    again = url_for("console.refund_form", reference=order.reference)
    amount_text = (form.amount.data or "").strip()
    amount = None  # the rest
    if amount_text:
        if not MINOR.fullmatch(amount_text):
            return problem(
                400,
                f"amount is in the currency's smallest unit, a whole number ({amount_text[:20]!r} is not one: "
                f"$12.50 is 1250); leave it out to refund all that is left.",
                title="Check the amount",
                back=again,
            )
        amount = int(amount_text)
    if not reason or len(reason) > 200:
        return problem(
            400, "Say why the order is refunded, in 200 characters at most.", title="A reason is needed", back=again
        )
    restock, restock_error = _restock_asked(form, order.id)
    if restock_error is not None:
        return problem(400, restock_error, title="Put the stock back?", back=again)
    key = form.request_key.data or submission_key(order.id, amount_text or "rest", reason, _key_part(restock))
    if not KEY.fullmatch(key):
        return problem(
            400, "This form has no valid request key: open the refund page again and confirm from there.", back=again
        )
    db.session.rollback()  # the use case reads the order afresh, locked, in its own transaction
    result = refund_order(
        order.id, amount=amount, reason=reason, restock=restock, request_key=key, operator=operator_name(), now=utcnow()
    )
    currency = order.currency
    if result.outcome is RefundOutcome.MISSING:
        return no_order(reference)
    if result.outcome is RefundOutcome.REFUSED:
        assert result.why is not None, "a refused refund says why"
        words = refusal_words(
            result.why,
            currency,
            amount=result.amount,
            left=result.left,
            status=result.status.value if result.status else None,
            restock=result.restock_words,
        )
        return problem(
            409
            if result.why in ("not_paid", "no_payment", "nothing_left", "already_restocked", "restock_refused")
            else 400,
            words,
            title="Not refunded",
            back=again,
            reference=order.reference,
            why=result.why,
        )
    stock = f" Put back in stock: {result.restock_words}." if result.restocked else ""
    if result.outcome is RefundOutcome.ALREADY:
        message = (
            f"This refund of {format_money(result.amount, currency)} was already made (the same submission "
            f"came twice); nothing more was refunded or put back.{stock}"
        )
    else:
        message = (
            f"Refunding {format_money(result.amount, currency)} to the customer's payment; "
            f"{format_money(result.left, currency)} is left to refund.{stock} "
            "The refund follows the provider's answer on this page."
        )
    payload = {
        "reference": order.reference,
        "refund_id": result.refund_id,
        "amount": result.amount,
        "currency": currency,
        "refundable": result.left,
        "restocked": result.restocked,
        "restocked_lines": [
            {"sku": g.sku, "quantity": g.quantity, "on_hand_before": g.on_hand_before, "on_hand_after": g.on_hand_after}
            for g in result.given
        ],
        "already": result.outcome is RefundOutcome.ALREADY,
    }
    return done(message, payload, back, "ok" if result.outcome is RefundOutcome.DONE else "warning")
