"""What a customer is told about their cart and a refused checkout: the use cases (orders.cart,
orders.checkout) say what happened as codes and facts, this says it in words."""

from __future__ import annotations

from ..orders.cart import CartChange, CartChangeOutcome
from ..orders.checkout import CheckoutRefused, HeldBy, Refusal


def cart_words(change: CartChange) -> str:
    """The sentence for a cart change: why it was refused, or what an add put in ("" for a change
    that says nothing, such as a quantity set or a line removed)."""
    outcome = change.outcome
    if outcome is CartChangeOutcome.SHORT:
        if change.available == 0:
            return f"Sold out: {change.item or 'this item'} cannot be added until it is back in stock."
        return f"Only {change.available} of {change.item} left; you asked for {change.wanted}."
    if outcome is CartChangeOutcome.NOT_FOR_SALE:
        return "That item is not for sale."
    if outcome is CartChangeOutcome.NOT_IN_CART:
        return "That item is not in your cart."
    if outcome is CartChangeOutcome.TOO_MANY:
        return (
            f"At most {change.limit} of one item per order: you asked for {change.wanted} of "
            f"{change.item or 'this item'}."
        )
    if change.item:  # an add: what it put in
        return f"Added {change.quantity} × {change.item} to your cart."
    return ""


_REFUSAL_WORDS = {
    Refusal.EMPTY_CART: "Your cart is empty.",
    Refusal.OUT_OF_STOCK: "Some items do not have enough stock left.",
    Refusal.UNAVAILABLE: "Some items are no longer sold; remove them from your cart.",
    Refusal.MIXED_CURRENCY: "Items priced in different currencies cannot be bought together.",
    Refusal.CART_CLOSED: "This cart was already checked out.",
    Refusal.TOO_MANY_OF_ONE: "At most {limit} of one item per order; reduce these lines:",
    Refusal.TOO_MANY_UNPAID: (
        "This browser already has {orders} waiting for payment. Pay for or cancel one of them "
        "(Your orders) before placing another."
    ),
}
# The address's orders, some placed from another browser: this browser is not shown them, it may
# have their links emailed to the address (storefront.order_links).
HELD_BY_ADDRESS = (
    "The address {email} already has {orders} waiting for payment, placed from another browser "
    "or device. Pay for or cancel one of them before placing another: we can email their links to that address."
)

# The client address's orders (an office or a mobile network shares one): nothing to show or email.
HELD_BY_CLIENT_ADDRESS = (
    "Your network address already has {orders} waiting for payment, the most one address may hold. "
    "Pay for or cancel one of yours, or try again once others are paid or expire."
)

EMPTY_CART = _REFUSAL_WORDS[Refusal.EMPTY_CART]
# A second checkout of a cart that has just become an order points at it (storefront.routes).
JUST_ORDERED = "This cart was just ordered: see order {reference}."


def orders_words(count: int | None) -> str:
    """ "1 order", "3 orders"."""
    return f"{count} order" if count == 1 else f"{count} orders"


def checkout_refusal_words(refused: CheckoutRefused, email: str = "") -> str:
    """The sentence for a refused checkout, followed by each short or unavailable line and what
    is left of it. `email`: the address the checkout was for, named when its orders filled the
    unpaid-order limit."""
    if refused.held_by is HeldBy.ADDRESS:
        return HELD_BY_ADDRESS.format(email=email, orders=orders_words(refused.limit))
    if refused.held_by is HeldBy.CLIENT_ADDRESS:
        return HELD_BY_CLIENT_ADDRESS.format(orders=orders_words(refused.limit))
    words = _REFUSAL_WORDS[refused.code].format(limit=refused.limit, orders=orders_words(refused.limit))
    if refused.code is Refusal.TOO_MANY_OF_ONE:
        return words + " " + "; ".join(f"{s['name'] or s['sku']}: you asked for {s['requested']}" for s in refused.over)
    if refused.shortages:
        words += " " + "; ".join(
            f"{s.get('name') or s.get('sku', s['variant_id'])}: {s['available']} left"
            + (f", you asked for {s['requested']}" if "requested" in s else "")
            for s in refused.shortages
        )
    return words
