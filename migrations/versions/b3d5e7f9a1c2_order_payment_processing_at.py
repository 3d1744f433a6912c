"""orders.payment_processing_at: money may still come for the order's session (an async payment, or a cancelled order the sweep watches)

Revision ID: b3d5e7f9a1c2
Revises: 7a1f0c2d9e4b
Create Date: 2026-11-30 11:30:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'b3d5e7f9a1c2'
down_revision = '7a1f0c2d9e4b'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.add_column(sa.Column('payment_processing_at', shop.models.types.UTCDateTime(timezone=True),
                                      nullable=True))
        batch_op.create_index(batch_op.f('ix_orders_payment_processing_at'), ['payment_processing_at'], unique=False)


def downgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_orders_payment_processing_at'))
        batch_op.drop_column('payment_processing_at')
