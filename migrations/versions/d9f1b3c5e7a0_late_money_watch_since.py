"""orders.late_money_watch_since: the sweep's watch of a cancelled order whose session could still
take money, apart from payment_processing_at (an async payment settling on a live order), which
carried both facts until now

Revision ID: d9f1b3c5e7a0
Revises: c8e0a2b4d6f9
Create Date: 2026-12-02 06:30:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'd9f1b3c5e7a0'
down_revision = 'c8e0a2b4d6f9'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.add_column(sa.Column('late_money_watch_since', shop.models.types.UTCDateTime(timezone=True),
                                      nullable=True))
    # A cancelled order's mark was always the watch; a live order's stays the async payment's.
    op.execute("UPDATE orders SET late_money_watch_since = payment_processing_at, payment_processing_at = NULL "
               "WHERE status = 'Cancelled' AND payment_processing_at IS NOT NULL")
    with op.batch_alter_table('orders', schema=None) as batch_op:
        # The sweep looks for exactly the watched orders (few); nothing selects by the other column.
        batch_op.drop_index('ix_orders_payment_processing_at')
        batch_op.create_index('ix_orders_late_money_watch_since', ['late_money_watch_since'], unique=False)


def downgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_index('ix_orders_late_money_watch_since')
        batch_op.create_index('ix_orders_payment_processing_at', ['payment_processing_at'], unique=False)
    op.execute("UPDATE orders SET payment_processing_at = late_money_watch_since "
               "WHERE late_money_watch_since IS NOT NULL")
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_column('late_money_watch_since')
