"""orders.cancel_reason and orders.cancelled_at: why and when an order was cancelled, on its own
row (written by the order store's cancel), so the order's pages and JSON read one row; backfilled
from each cancelled order's last OrderCancelled event

Revision ID: b1d3f5a7c9e2
Revises: f0a2b4c6d8e1
Create Date: 2026-12-05 07:20:00

"""

from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = "b1d3f5a7c9e2"
down_revision = "f0a2b4c6d8e1"
branch_labels = None
depends_on = None

# The reason as the event's payload says it, on each database's JSON.
_REASON = {
    "postgresql": "e.payload->>'reason'",
    "sqlite": "json_extract(e.payload, '$.reason')",
}


def _last_cancel_event(column: str) -> str:
    return (
        f"(SELECT {column} FROM outbox_events e WHERE e.order_id = orders.id AND e.name = 'OrderCancelled'"
        " ORDER BY e.id DESC LIMIT 1)"
    )


def upgrade():
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cancel_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("cancelled_at", shop.models.types.UTCDateTime(timezone=True), nullable=True))
    reason = _REASON[op.get_bind().dialect.name]
    op.execute(
        f"UPDATE orders SET cancel_reason = {_last_cancel_event(reason)},"
        f" cancelled_at = {_last_cancel_event('e.created_at')}"
        " WHERE status = 'Cancelled'"
    )


def downgrade():
    with op.batch_alter_table("orders", schema=None) as batch_op:
        batch_op.drop_column("cancelled_at")
        batch_op.drop_column("cancel_reason")
