"""What a customer is told about their cart: the use cases (orders.cart) say what happened as
codes and facts, this says it in words."""

from __future__ import annotations

from ..orders.cart import MOST_OF_ONE_ITEM, CartChange, CartStatus


def cart_words(change: CartChange) -> str:
    """The sentence for a cart change: why it was refused, or what an add put in ("" for a change
    that says nothing, such as a quantity set or a line removed)."""
    status = change.status
    if status is CartStatus.SHORT:
        if change.available == 0:
            return f"Sold out: {change.item or 'this item'} cannot be added until it is back in stock."
        return f"Only {change.available} of {change.item} left; you asked for {change.wanted}."
    if status is CartStatus.NOT_FOR_SALE:
        return "That item is not for sale."
    if status is CartStatus.NOT_IN_CART:
        return "That item is not in your cart."
    if status is CartStatus.TOO_MANY:
        return f"At most {MOST_OF_ONE_ITEM} of one item per order."
    if change.item:  # an add: what it put in
        return f"Added {change.quantity} × {change.item} to your cart."
    return ""

