"""outbox_deliveries.traceparent and scheduled_commands.traceparent: the W3C trace context of the
span whose commit wrote the row (with tracing on: shop.traces), so the span of whoever runs it
joins that trace, as the request id beside it joins the log lines

Revision ID: b0cb6899d406
Revises: e6b8d0f2a4c7
Create Date: 2026-12-05 16:40:00

"""
from alembic import op
import sqlalchemy as sa


revision = 'b0cb6899d406'
down_revision = 'e6b8d0f2a4c7'
branch_labels = None
depends_on = None


def upgrade():
    # Nullable, no default: adding it rewrites nothing on PostgreSQL (a catalog change only).
    with op.batch_alter_table('outbox_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('traceparent', sa.Text(), nullable=True))
    with op.batch_alter_table('scheduled_commands', schema=None) as batch_op:
        batch_op.add_column(sa.Column('traceparent', sa.Text(), nullable=True))


def downgrade():
    with op.batch_alter_table('scheduled_commands', schema=None) as batch_op:
        batch_op.drop_column('traceparent')
    with op.batch_alter_table('outbox_deliveries', schema=None) as batch_op:
        batch_op.drop_column('traceparent')
