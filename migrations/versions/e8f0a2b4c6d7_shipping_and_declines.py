"""products.ships, orders.ships / shipping_details / payment_declined_at: physical goods collect a shipping address at checkout, and a declined card is told on the order page

Revision ID: e8f0a2b4c6d7
Revises: c6d8e0f2a4b5
Create Date: 2026-12-02 21:10:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'e8f0a2b4c6d7'
down_revision = 'c6d8e0f2a4b5'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('products', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ships', sa.Boolean(), nullable=False, server_default=sa.true()))
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ships', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('shipping_details', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('payment_declined_at', shop.models.types.UTCDateTime(timezone=True),
                                      nullable=True))


def downgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_column('payment_declined_at')
        batch_op.drop_column('shipping_details')
        batch_op.drop_column('ships')
    with op.batch_alter_table('products', schema=None) as batch_op:
        batch_op.drop_column('ships')
