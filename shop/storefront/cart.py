"""The storefront's catalog and cart (docs/REFERENCE.md, Storefront): what is for sale, and this
browser's cart with its lines checked against the stock."""

from __future__ import annotations

from flask import flash, redirect, url_for
from sqlalchemy import and_, case, select

from ..extensions import db
from ..models import Cart, InventoryItem, Product, Variant
from ..orders import cart as carts
from ..orders.cart import CartChangeOutcome
from ..web.answers import at_address, browser_id, respond, wants_json
from ..web.idempotency import idempotent
from ..web.requests import MAX_ID
from .blueprint import bp
from .cart_words import cart_words
from .forms import ActionForm, AddToCartForm, CheckoutForm, QuantityForm, first_error

# The catalog in one prebuilt statement of plain rows (no mapped objects): every request's first
# page, where three ORM queries (products, their variants, their stock) cost 2.3 ms of CPU.
_CATALOG = (
    select(
        Product.id.label("product_id"),
        Product.name.label("product_name"),
        Product.description,
        Variant.id,
        Variant.sku,
        Variant.name,
        Variant.price,
        Variant.currency,
        case(
            (and_(InventoryItem.variant_id.is_not(None), InventoryItem.deleted_at.is_(None)), InventoryItem.on_hand),
            else_=0,
        ).label("available"),
    )
    .join(Variant, Variant.product_id == Product.id)
    .outerjoin(InventoryItem, InventoryItem.variant_id == Variant.id)
    .where(Variant.deleted_at.is_(None))
    .order_by(Product.id, Variant.id)
)


def _catalog() -> list[dict]:
    """Products with at least one variant for sale, in id order, each with its variants and stock."""
    out: list[dict] = []
    for row in db.session.execute(_CATALOG):
        if not out or out[-1]["id"] != row.product_id:
            out.append({"id": row.product_id, "name": row.product_name, "description": row.description, "variants": []})
        out[-1]["variants"].append(
            {
                "id": row.id,
                "sku": row.sku,
                "name": row.name,
                "price": row.price,
                "currency": row.currency,
                "available": row.available,
            }
        )
    return out


@bp.get("/")
def catalog():
    """The catalog with prices and stock."""
    products = _catalog()
    data = {"products": [{k: p[k] for k in ("id", "name", "variants")} for p in products]}
    return respond("storefront/catalog.html", data, products=products, form=AddToCartForm())


def _open_cart() -> Cart | None:
    return carts.open_cart(browser_id(create=False))


def _cart_data(cart: Cart | None) -> dict:
    items, total, currency = [], 0, None
    if cart is not None:
        for item in cart.items:
            v = item.variant
            inv = db.session.get(InventoryItem, v.id)
            available = inv.on_hand if inv is not None and inv.deleted_at is None and v.deleted_at is None else 0
            line_total = v.price * item.quantity
            total += line_total
            currency = currency or v.currency
            items.append(
                {
                    "variant_id": v.id,
                    "sku": v.sku,
                    "name": f"{v.product.name} – {v.name}",
                    "quantity": item.quantity,
                    "unit_price": v.price,
                    "line_total": line_total,
                    "currency": v.currency,
                    "available": available,
                }
            )
    return {"items": items, "total": total, "currency": currency}


def render_cart(
    status: int = 200,
    error: str | None = None,
    shortages=None,
    form=None,
    field: str | None = None,
    over=None,
    ordered: tuple[str, str] | None = None,
    unpaid: dict | None = None,
    suggestion: dict | None = None,
):
    """The cart page. `field` names the input an error concerns ("email", "quantity-<variant id>"):
    the page shows the error beside it instead of in the banner. `ordered`: (reference, order page)
    of the order this cart has just become, which a second checkout of it points at. `unpaid`:
    whose orders filled UNPAID_ORDERS_PER_CLIENT and where to go from there (order_links).
    `suggestion`: the address as typed and the one probably meant (email_typos)."""
    cart = _open_cart()
    data = _cart_data(cart)
    if error:
        data["error"] = error
    if ordered:
        data["reference"], data["order_url"] = ordered
    if shortages:
        data["shortages"] = shortages
    if unpaid:
        data["unpaid_limit"] = unpaid
    if suggestion:
        data["suggested_email"] = suggestion["suggested"]
    if over:
        data["over_limit"] = over  # lines over MAX_LINE_QUANTITY, as a refused checkout found them
    # A line asking for more than is left blocks checkout until it is reduced or removed.
    short = {item["variant_id"] for item in data["items"] if item["quantity"] > item["available"]}
    if field == "stock" and not short:
        field = None  # the stock moved since: the refusal's own words, in the banner
    response = respond(
        "storefront/cart.html",
        data,
        status,
        form=form or CheckoutForm(),
        action=ActionForm(),
        error_field=field,
        short=short,
        suggestion=suggestion,
        address=url_for("storefront.cart"),
    )
    return at_address(response, url_for("storefront.cart"))


@bp.get("/cart")
def cart():
    """This browser's cart."""
    return render_cart()


_CART_STATUS = {
    CartChangeOutcome.NOT_FOR_SALE: 404,
    CartChangeOutcome.NOT_IN_CART: 404,
    CartChangeOutcome.SHORT: 409,
    CartChangeOutcome.TOO_MANY: 400,
}


@bp.post("/cart/items")
@idempotent
def add_to_cart():
    """Add a variant to the cart (form: variant_id, quantity)."""
    form = AddToCartForm()
    if not form.validate():
        return render_cart(400, first_error(form))
    wanted_id, quantity = form.variant_id.data, form.quantity.data
    assert wanted_id is not None and quantity is not None, "the form validated: DataRequired, LineQuantity"
    # Ids are 32-bit keys: a larger number names no item (and PostgreSQL would refuse to compare).
    variant = carts.variant_to_add(wanted_id) if 0 < wanted_id <= MAX_ID else None
    new_browser = browser_id(create=False) is None  # then no cart of its own to look for
    change = carts.add_item(browser_id(create=True), variant, quantity, new_browser=new_browser)
    if not change.ok:
        return render_cart(_CART_STATUS[change.outcome], cart_words(change))
    if wants_json():
        return render_cart(201)
    flash(cart_words(change))
    return redirect(url_for("storefront.cart"), 303)


@bp.post("/cart/items/<id:variant_id>/quantity")
def set_quantity(variant_id: int):
    """Set one line's quantity (form: quantity, 1..99), checked against the stock like an add."""
    form = QuantityForm()
    field = f"quantity-{variant_id}"
    if not form.validate():
        return render_cart(400, first_error(form), field=None if "csrf_token" in form.errors else field)
    quantity = form.quantity.data
    assert quantity is not None, "the form validated: LineQuantity refuses no number"
    change = carts.set_quantity(browser_id(), variant_id, quantity)
    if not change.ok:
        return render_cart(
            _CART_STATUS[change.outcome],
            cart_words(change),
            field=field if change.outcome in (CartChangeOutcome.SHORT, CartChangeOutcome.TOO_MANY) else None,
        )
    if wants_json():
        return render_cart()
    return redirect(url_for("storefront.cart"), 303)


@bp.post("/cart/items/<id:variant_id>/delete")
def remove_from_cart(variant_id: int):
    """Remove one item from the cart."""
    form = ActionForm()
    if not form.validate():
        return render_cart(400, first_error(form))
    carts.remove_item(browser_id(), variant_id)
    if wants_json():
        return render_cart()
    return redirect(url_for("storefront.cart"), 303)
