"""The receipt (the order_paid email, shop/emails.py) lists the order's lines: its send reads the
order with them in one statement, not the order and then its lines."""

from __future__ import annotations

from sqlalchemy import event as sa_event

from shop import emails
from shop.extensions import db


def test_the_receipt_reads_its_order_and_lines_in_one_statement(order_id):
    statements: list[str] = []

    def record(conn, cursor, statement, *args):
        statements.append(statement)

    sa_event.listen(db.engine, "before_cursor_execute", record)
    try:
        assert emails.send(order_id, "order_paid", tag="reads") is True
    finally:
        sa_event.remove(db.engine, "before_cursor_execute", record)
    db.session.rollback()
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]  # (SQLite's BEGIN aside)
    assert len(reads) == 1 and "order_lines" in reads[0], reads
