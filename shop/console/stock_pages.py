"""A variant's stock: every correction made to it (who, when, old -> new, why), the orders that
took or gave back its stock, what its orders hold of the shelf, and the forms that correct it
(`orders.stock.correct_stock`: from a shelf count, set on hand to a count, or adjust by a delta, all
safe against checkouts running meanwhile)."""

from __future__ import annotations

import hashlib

from flask import url_for
from sqlalchemy import func, select
from wtforms import HiddenField, StringField, TextAreaField

from ..domain.deadlines import utcnow
from ..domain.timestamps import iso
from ..extensions import db
from ..models import InventoryItem, Order, OrderLine, StockCorrection, Variant
from ..orders.stock import CorrectionOutcome, StockChange, StockMode, correct_stock
from ..orders.stock_held import Held, held_by_orders, held_by_variants
from ..web.answers import respond, wants_json
from ..web.numbers import INT4_MAX, whole_number
from . import audit
from .answers import done, operator_name, page_number, problem
from .blueprint import bp
from .forms import ConsoleForm
from .money_actions import KEY, new_request_key

HISTORY = 50
RECENT_ORDERS = 5_000


class StockForm(ConsoleForm):
    # Checked in the view, so each mistake gets words that say what to type.
    count = StringField("Count on the shelf")
    on_hand = StringField("Set to")
    delta = StringField("Change by")
    seen = HiddenField()
    held = HiddenField()
    reason = TextAreaField("Reason")
    request_key = HiddenField()
    next = HiddenField()


@bp.get("/inventory")
def inventory_list():
    """Every variant with its stock now, what its orders hold and so what its shelf should hold, and a
    link to its history and correction forms."""
    rows = db.session.execute(
        select(Variant.id, Variant.sku, Variant.name, InventoryItem.on_hand, Variant.deleted_at)
        .outerjoin(InventoryItem, InventoryItem.variant_id == Variant.id)
        .order_by(Variant.sku)
        .limit(50)
        .offset((page_number() - 1) * 50)
    ).all()
    total = db.session.execute(select(func.count()).select_from(Variant)).scalar_one()
    held = held_by_variants([r.id for r in rows])
    data = {
        "variants": [
            {
                "id": r.id,
                "sku": r.sku,
                "name": r.name,
                "on_hand": r.on_hand,
                "held": held.get(r.id, Held()).total,
                "shelf": r.on_hand + held.get(r.id, Held()).total if r.on_hand is not None else None,
                "retired": r.deleted_at is not None,
            }
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


def _stock_page(variant_id: int, status: int = 200, error: str | None = None, typed: dict | None = None):
    """The variant's page; `typed`: a refused correction's form as the operator filled it
    (`mode`, `value`, `reason`, `request_key`), shown again against the figures now."""
    variant = db.session.get(Variant, variant_id)
    if variant is None:
        return problem(
            404, f"There is no variant {variant_id}.", title="No such variant", back=url_for("console.inventory_list")
        )
    item = db.session.get(InventoryItem, variant_id)
    held = held_by_orders(variant_id)
    data = {
        "variant": {
            "id": variant.id,
            "sku": variant.sku,
            "name": variant.name,
            "retired": variant.deleted_at is not None,
        },
        "on_hand": item.on_hand if item is not None else None,
        "held": held.as_json(),
        "shelf": item.on_hand + held.total if item is not None else None,
        **_history(variant_id),
        "error": error,
    }
    typed = typed or {}
    keys = {f"{mode}_key": new_request_key() for mode in StockMode}
    if typed.get("request_key"):
        keys[f"{typed['mode']}_key"] = typed["request_key"]
    return respond("console/stock.html", data, status, typed=typed, **keys)


@bp.get("/inventory/<id:variant_id>")
def inventory(variant_id):
    """One variant's stock now, what its orders hold, its history, and the correction forms."""
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
    "below_held": (
        "The shelf count {value} is below the {held} units orders hold of this variant: on hand cannot go "
        "below zero. Nothing was changed; count again, or look at the orders that hold it."
    ),
    "count_changed": (
        "The stock changed while you were looking (a checkout, a cancel or a restore moved it): on hand is "
        "{on_hand} now and orders hold {held}, so the shelf should hold {shelf}. Nothing was changed; check "
        "your count against these figures and set it anyway if it stands."
    ),
}
ONE_FIELD = (
    "Give exactly one of count (the shelf count), on_hand (the count to set) or delta (the change, like +3 "
    "or -2), not both."
)
NUMBER_WORDS = {
    StockMode.COUNT: "the count on the shelf",
    StockMode.SET: "the count to set",
    StockMode.ADJUST: "the change, like +3 or -2",
}


def _asked(form: StockForm) -> tuple[StockMode, int, int | None, int | None] | str:
    """(mode, value, seen, held seen) from the form, or the words of what is wrong with it: each
    ASCII digits within an int4 column (web.numbers), the value signed, the figures not."""
    fields = {StockMode.COUNT: form.count, StockMode.SET: form.on_hand, StockMode.ADJUST: form.delta}
    given = [(mode, text) for mode, field in fields.items() if (text := (field.data or "").strip())]
    if len(given) != 1:
        return ONE_FIELD
    (mode, text), seen, held = given[0], (form.seen.data or "").strip(), (form.held.data or "").strip()
    value = whole_number(text, -INT4_MAX, INT4_MAX)
    if value is None:
        return f"Enter {NUMBER_WORDS[mode]} as a whole number from -{INT4_MAX} to {INT4_MAX}."
    figures = [whole_number(t) if t else None for t in (seen, held)]
    if any(f is None for f, t in zip(figures, (seen, held), strict=True) if t):
        return "The page's figures are not whole numbers from 0 to 2147483647: open the stock page again."
    if mode is not StockMode.ADJUST:
        return mode, value, figures[0], figures[1] if mode is StockMode.COUNT else None
    return mode, value, None, None


@bp.post("/inventory/<id:variant_id>/adjust")
def adjust_inventory(variant_id):
    """Correct a variant's stock, with a `reason`: `count` (a shelf count: on hand becomes it less
    what orders hold, while on hand is still `seen` and orders still hold `held`), `on_hand` sets
    it to a count (only if it is still `seen`, when given) or `delta` (+ or -) adjusts it; once
    per submission (`request_key`)."""
    form = StockForm()
    reason = (form.reason.data or "").strip()
    audit.about(f"stock of variant {variant_id}", reason=reason or None)
    back = url_for("console.inventory", variant_id=variant_id)
    asked = _asked(form)
    if isinstance(asked, str):
        title = "Check the number" if "whole number" in asked else "Cannot do that"
        return problem(400, asked, title=title, back=back)
    mode, value, seen, held = asked
    text = str(value)
    if not reason or len(reason) > 2000:
        return problem(
            400, WHY_WORDS["no_reason"] + " (2000 characters at most)", title="A reason is needed", back=back
        )
    key = form.request_key.data or _submission_key(variant_id, mode, text, _typed(seen), _typed(held), reason)
    if not KEY.fullmatch(key):
        return problem(400, "This form has no valid request key: open the stock page again.", back=back)
    db.session.rollback()
    result = correct_stock(
        variant_id,
        mode=mode,
        value=value,
        seen=seen,
        seen_held=held,
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
        typed = {"mode": mode.value, "value": text, "reason": reason, "request_key": form.request_key.data}
        return _refused(variant_id, result, _typed(seen), typed, back)
    return _corrected(variant_id, result, back)


def _refused(variant_id: int, result: StockChange, seen: str, typed: dict, back: str):
    """A refusal in words. A count or a set comes back as the page, the operator's values kept,
    against the figures now (a conflict's button sets it anyway against them)."""
    assert result.why is not None, "a refused correction says why"
    db.session.rollback()
    held = held_by_orders(variant_id)
    why = "count_changed" if result.why == "changed" and typed["mode"] == StockMode.COUNT else result.why
    on_hand = result.on_hand if result.on_hand is not None else 0
    words = WHY_WORDS[why].format(
        on_hand=result.on_hand, seen=seen, value=typed["value"], held=held.total, shelf=on_hand + held.total
    )
    status = 409 if result.why == "changed" else 400
    if wants_json() or typed["mode"] == StockMode.ADJUST:
        extra = {"held": held.as_json()} if typed["mode"] == StockMode.COUNT else {}
        return problem(
            status, words, title="Stock not changed", back=back, on_hand=result.on_hand, why=result.why, **extra
        )
    audit.outcome(words)
    return _stock_page(variant_id, status, error=words, typed={**typed, "conflict": result.why == "changed"})


def _corrected(variant_id: int, result: StockChange, back: str):
    already = result.outcome is CorrectionOutcome.ALREADY
    if already:
        message = f"This correction was already made (the same submission came twice): the stock is {result.on_hand}."
    elif result.held is not None:
        h = result.held
        message = (
            f"Stock of variant {variant_id} set from a shelf count of {result.count}: orders hold {h.total} "
            f"({h.unpaid} unpaid, {h.paid} paid and not yet shipped, {h.returning} being given back), "
            f"so on hand went from {result.old} to {result.new}."
        )
    else:
        message = f"Stock of variant {variant_id} corrected from {result.old} to {result.new}."
    payload = {
        "variant_id": variant_id,
        "old": result.old,
        "new": result.new,
        "on_hand": result.on_hand,
        "correction_id": result.correction_id,
        "already": already,
        "count": result.count,
        "held": result.held.as_json() if result.held is not None else None,
    }
    return done(message, payload, back, "warning" if already else "ok")


def _typed(figure: int | None) -> str:
    """A figure as the form carried it ("" for none)."""
    return "" if figure is None else str(figure)


def _submission_key(*parts) -> str:
    """A submission's key when its form carried none (a script): the same correction with the
    same reason by the same operator is made once."""
    digest = hashlib.sha256("|".join(map(str, (operator_name(), *parts))).encode()).hexdigest()
    return f"auto-{digest[:40]}"
