"""Finding an order by a reference that came from outside (a URL, a form, a provider's event):
the order store's `by_reference`, under the name the storefront and the console know."""

from __future__ import annotations

from ..store.order_store import by_reference as order_by_reference  # noqa: F401
