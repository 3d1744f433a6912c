"""orders.created_at indexed: the console's date filter (from/to, the day an order was placed)

Without it, an order list filtered to a few days long past read every newer order first, newest
to oldest along the primary key, before it reached the range (a million rows at a year back).

Revision ID: d7e9f1a3b5c6
Revises: e8f0a2b4c6d7
Create Date: 2026-12-02 21:40:00

"""
from alembic import op


revision = 'd7e9f1a3b5c6'
down_revision = 'e8f0a2b4c6d7'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.create_index('ix_orders_created_at', ['created_at'], unique=False)


def downgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_index('ix_orders_created_at')
