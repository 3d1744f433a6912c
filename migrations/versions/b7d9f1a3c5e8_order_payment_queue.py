"""orders.payment_queued_at: an order in line for its payment page while the provider's session
budget is spent, with a partial index over just the orders in line (arrival order)

Revision ID: b7d9f1a3c5e8
Revises: a9c1e3f5b7d9
Create Date: 2026-12-02 03:00:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'b7d9f1a3c5e8'
down_revision = 'a9c1e3f5b7d9'
branch_labels = None
depends_on = None

IN_LINE = "payment_queued_at IS NOT NULL"


def upgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.add_column(sa.Column('payment_queued_at', shop.models.types.UTCDateTime(timezone=True),
                                      nullable=True))
        batch_op.create_index('ix_orders_payment_queue', ['payment_queued_at', 'id'], unique=False,
                              postgresql_where=sa.text(IN_LINE), sqlite_where=sa.text(IN_LINE))


def downgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_index('ix_orders_payment_queue')
        batch_op.drop_column('payment_queued_at')
