"""What adding an item to a cart costs the database: its answer names the item from what it read
before its commit, not by reading the variant and its product again after it; the item, its name
and its stock are one read; a browser whose id the add itself made looks for no cart and no line."""

from __future__ import annotations

from sqlalchemy import event

from factories import catalog_rows
from payment_helpers import JSON, Shopper
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


def _statements(engine, run) -> list[str]:
    """Each statement `run()` sent, as its verb and table ("SELECT variants"), and COMMITs."""
    seen: list[str] = []

    def statement(conn, cursor, text, parameters, context, executemany):
        words = text.replace("(", " ").split()
        verb = words[0].upper()
        if verb == "BEGIN":  # SQLite's, sent as a statement
            return
        after = {"SELECT": "FROM", "INSERT": "INTO", "UPDATE": "UPDATE", "DELETE": "FROM"}.get(verb)
        seen.append(f"{verb} {words[words.index(after) + 1] if after in words else ''}".strip())

    def committed(conn):
        seen.append("COMMIT")

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "commit", committed)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "commit", committed)
    return seen


def test_a_new_browsers_first_add_reads_the_item_once_and_looks_for_no_cart(shop):
    browser = Shopper(shop)
    with shop.app_context():
        engine = db.engine
    answers = []

    first = _statements(engine, lambda: answers.append(browser.add("SOCK-M", 2)))

    assert answers[0].status_code == 303
    assert first == ["SELECT variants", "INSERT carts", "INSERT cart_items", "COMMIT"], first
    # The same browser's next add finds its cart and its line, and adds to it.
    again = _statements(engine, lambda: answers.append(browser.add("SOCK-M", 1)))
    assert again[:3] == ["SELECT variants", "SELECT carts", "SELECT cart_items"], again
    lines = browser.client.get("/cart", headers=JSON).get_json()["items"]
    assert [(line["sku"], line["quantity"]) for line in lines] == [("SOCK-M", 3)]
