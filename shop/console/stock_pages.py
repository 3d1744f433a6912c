"""A variant's stock: every correction made to it (who, when, old -> new, why), the orders that
took or gave back its stock, and the form that corrects it (`orders.stock.correct_stock`: set to a
count the operator saw, or adjust by a delta, both safe against checkouts running meanwhile)."""

from __future__ import annotations

import hashlib
import re

from flask import url_for
from sqlalchemy import func, select
from wtforms import HiddenField, StringField, TextAreaField

from ..domain.deadlines import utcnow
from ..domain.timestamps import iso
from ..extensions import db
from ..models import InventoryItem, Order, OrderLine, StockCorrection, Variant
from ..orders.stock import CorrectionOutcome, StockMode, correct_stock
from ..web.answers import respond
from . import audit
from .answers import done, operator_name, page_number, problem
from .blueprint import bp
from .forms import ConsoleForm
from .money_actions import KEY, new_request_key

HISTORY = 50
RECENT_ORDERS = 5_000
INTEGER = re.compile(r"[+-]?\d{1,10}")


class StockForm(ConsoleForm):
    # Checked in the view, so each mistake gets words that say what to type.
    on_hand = StringField("Set to")
    delta = StringField("Change by")
    seen = HiddenField()
    reason = TextAreaField("Reason")
    request_key = HiddenField()
    next = HiddenField()


@bp.get("/inventory")
def inventory_list():
    """Every variant with its stock now, and a link to its history and correction form."""
    rows = db.session.execute(
        select(Variant.id, Variant.sku, Variant.name, InventoryItem.on_hand, Variant.deleted_at)
        .outerjoin(InventoryItem, InventoryItem.variant_id == Variant.id)
        .order_by(Variant.sku)
        .limit(50)
        .offset((page_number() - 1) * 50)
    ).all()
    total = db.session.execute(select(func.count()).select_from(Variant)).scalar_one()
    data = {
        "variants": [
            {"id": r.id, "sku": r.sku, "name": r.name, "on_hand": r.on_hand, "retired": r.deleted_at is not None}
            for r in rows
        ],
        "page": page_number(),
        "total": total,
    }
    return respond("console/stock_list.html", data)


def _history(variant_id: int) -> dict:
    corrections = (
        db.session.execute(
            select(StockCorrection)
            .where(StockCorrection.variant_id == variant_id)
            .order_by(StockCorrection.id.desc())
            .limit(HISTORY)
        )
        .scalars()
        .all()
    )
    # What orders did to the stock: a checkout took the line's quantity; a restore (or a refund
    # with restock) gave it back. Lines have no index by variant (checkout's inserts would pay for
    # one), so only the newest RECENT_ORDERS orders are looked at: a range on the lines' order index.
    newest = db.session.execute(select(func.max(Order.id))).scalar_one() or 0
    movements = db.session.execute(
        select(Order.reference, Order.status, Order.created_at, Order.inventory_restored, OrderLine.quantity)
        .join(OrderLine, OrderLine.order_id == Order.id)
        .where(OrderLine.order_id > newest - RECENT_ORDERS, OrderLine.variant_id == variant_id)
        .order_by(Order.id.desc())
        .limit(HISTORY)
    ).all()
    return {
        "corrections": [
            {
                "id": c.id,
                "at": iso(c.created_at),
                "operator": c.operator,
                "mode": c.mode,
                "old": c.old_on_hand,
                "new": c.new_on_hand,
                "delta": c.delta,
                "reason": c.reason,
            }
            for c in corrections
        ],
        "orders": [
            {
                "reference": m.reference,
                "status": m.status.value,
                "placed_at": iso(m.created_at),
                "quantity": m.quantity,
                "given_back": bool(m.inventory_restored),
            }
            for m in movements
        ],
    }


def _stock_page(variant_id: int, status: int = 200, error: str | None = None, **form):
    variant = db.session.get(Variant, variant_id)
    if variant is None:
        return problem(
            404, f"There is no variant {variant_id}.", title="No such variant", back=url_for("console.inventory_list")
        )
    item = db.session.get(InventoryItem, variant_id)
    data = {
        "variant": {
            "id": variant.id,
            "sku": variant.sku,
            "name": variant.name,
            "retired": variant.deleted_at is not None,
        },
        "on_hand": item.on_hand if item is not None else None,
        **_history(variant_id),
        "error": error,
    }
    return respond("console/stock.html", data, status, set_key=new_request_key(), adjust_key=new_request_key())


@bp.get("/inventory/<id:variant_id>")
def inventory(variant_id):
    """One variant's stock now, its history (corrections and orders), and the correction form."""
    return _stock_page(variant_id)


WHY_WORDS = {
    "no_reason": "Say why the stock is corrected: the reason is the only record of it.",
    "no_change": "That changes nothing: the stock is already {on_hand}.",
    "negative": "Stock cannot go below zero: it is {on_hand} now.",
    "too_large": "That is more stock than an inventory row holds.",
    "changed": (
        "The stock changed while you were looking (a checkout or a restore moved it): it is {on_hand} now, "
        "not {seen}. Nothing was changed; look at the count again and correct it from there."
    ),
}


@bp.post("/inventory/<id:variant_id>/adjust")
def adjust_inventory(variant_id):
    """Correct a variant's stock, with a `reason`: `on_hand` sets it to a count (only if it is
    still `seen`, the count the page showed, when given) or `delta` (+ or -) adjusts it; once per
    submission (`request_key`)."""
    form = StockForm()
    reason = (form.reason.data or "").strip()
    audit.about(f"stock of variant {variant_id}", reason=reason or None)
    back = url_for("console.inventory", variant_id=variant_id)
    on_hand, delta, seen = (
        (form.on_hand.data or "").strip(),
        (form.delta.data or "").strip(),
        (form.seen.data or "").strip(),
    )
    if bool(on_hand) == bool(delta):
        return problem(
            400, "Give either on_hand (the count to set) or delta (the change, like +3 or -2), not both.", back=back
        )
    text = on_hand or delta
    if not INTEGER.fullmatch(text) or (seen and not INTEGER.fullmatch(seen)):
        what = "the count to set" if on_hand else "the change, like +3 or -2"
        return problem(400, f"Enter {what} as a whole number.", title="Check the number", back=back)
    if not reason or len(reason) > 2000:
        return problem(
            400, WHY_WORDS["no_reason"] + " (2000 characters at most)", title="A reason is needed", back=back
        )
    mode = StockMode.SET if on_hand else StockMode.ADJUST
    key = form.request_key.data or _submission_key(variant_id, mode, text, seen, reason)
    if not KEY.fullmatch(key):
        return problem(400, "This form has no valid request key: open the stock page again.", back=back)
    db.session.rollback()
    result = correct_stock(
        variant_id,
        mode=mode,
        value=int(text),
        seen=int(seen) if seen and mode is StockMode.SET else None,
        reason=reason,
        operator=operator_name(),
        request_key=key,
        now=utcnow(),
    )
    if result.outcome is CorrectionOutcome.MISSING:
        return problem(
            404,
            f"There is no stock row for variant {variant_id}.",
            title="No such stock",
            back=url_for("console.inventory_list"),
        )
    if result.outcome is CorrectionOutcome.REFUSED:
        assert result.why is not None, "a refused correction says why"
        words = WHY_WORDS[result.why].format(on_hand=result.on_hand, seen=seen)
        status = 409 if result.why == "changed" else 400
        return problem(status, words, title="Stock not changed", back=back, on_hand=result.on_hand, why=result.why)
    already = result.outcome is CorrectionOutcome.ALREADY
    message = (
        f"This correction was already made (the same submission came twice): the stock is {result.on_hand}."
        if already
        else f"Stock of variant {variant_id} corrected from {result.old} to {result.new}."
    )
    payload = {
        "variant_id": variant_id,
        "old": result.old,
        "new": result.new,
        "on_hand": result.on_hand,
        "correction_id": result.correction_id,
        "already": already,
    }
    return done(message, payload, back, "warning" if already else "ok")


def _submission_key(*parts) -> str:
    """A submission's key when its form carried none (a script): the same correction with the
    same reason by the same operator is made once."""
    digest = hashlib.sha256("|".join(map(str, (operator_name(), *parts))).encode()).hexdigest()
    return f"auto-{digest[:40]}"
