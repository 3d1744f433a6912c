"""The hot paths' prebuilt statements are built once and executed with bound parameters; that
only pays if SQLAlchemy can cache their compiled form. A statement it cannot cache (a VALUES
list with data, for one) is recompiled on every execution: measured at four times the round trip
it was written to save. This pins that each one has a cache key."""

from __future__ import annotations

import pytest

from shop import webhooks
from shop.models import OutboxDelivery, ScheduledCommand
from shop.orders import checkout
from shop.outbox import claims, dispatch, writer
from shop.payments import event_claims
from shop.saga import inventory
from shop.store import order_statements


def _hot_statements():
    yield "checkout: read the cart", checkout._READ_CART
    yield "checkout: close the cart", checkout._CLOSE_CART
    yield "checkout: decrement", checkout._DECREMENT
    yield "restore: increment", inventory._INCREMENT
    yield "restore: warning", inventory._WARN
    yield "outbox: event", writer._INSERT_EVENT
    yield "outbox: delivery", writer._INSERT_DELIVERY
    yield "outbox: command", writer._INSERT_COMMAND
    yield "outbox: event + 1 delivery", writer._insert_event_with_deliveries(("restore_inventory",))
    yield "outbox: event + 2 deliveries", writer._insert_event_with_deliveries(("a", "b"))
    for model in (OutboxDelivery, ScheduledCommand):
        table = model.__table__
        yield f"{table.name}: claim one", claims._claim_one(table)
        yield f"{table.name}: claim batch", claims._claim_many(table)
        yield f"{table.name}: mark done", claims._mark_done(table)
    yield (
        "commands: claim one, returning the row",
        claims._claim_one_returning(ScheduledCommand.__table__, dispatch.COMMANDS.claim_returns),
    )
    yield "webhook: receipt", webhooks._INSERT_RECEIPT
    # Every statement the order store owns, from its own registry: a new one is checked unasked.
    yield from order_statements.STATEMENTS.items()
    for dialect in ("postgresql", "sqlite"):
        yield f"webhook: claim event ({dialect})", event_claims.claim_statement(dialect)


@pytest.mark.parametrize("name,statement", list(_hot_statements()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_hot_prebuilt_statement_is_cacheable(name, statement):
    assert statement._generate_cache_key() is not None, f"{name} is recompiled on every execution"
