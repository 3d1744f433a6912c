"""What adding an item to a cart costs the database: its answer names the item from what it read
before its commit, not by reading the variant and its product again after it."""

from __future__ import annotations

from sqlalchemy import event

from factories import catalog_rows
from shop.extensions import db
from shop.models import Variant
from shop.orders.cart import CartChangeOutcome, add_item


def test_adding_an_item_reads_nothing_after_its_commit(fresh_ctx):
    (variant_id,) = catalog_rows(5)
    db.session.remove()
    variant = db.session.get(Variant, variant_id)
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement.split(None, 1)[0].upper())

    def committed(conn):
        statements.append("COMMIT")

    event.listen(db.engine, "before_cursor_execute", seen)
    event.listen(db.engine, "commit", committed)
    try:
        change = add_item("browser-statements", variant, 2)
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
        event.remove(db.engine, "commit", committed)

    assert change.outcome is CartChangeOutcome.DONE and change.item == f"{variant.product.name} – V0"
    assert statements[-1] == "COMMIT", statements
