"""orders.tax and orders.charged: what an order's accepted payment charged (the tax Stripe Tax
added under TAX_MODE=stripe, and the total charged), written with the payment; every refund of it
refunds from `charged`. Orders paid before: every accepted payment then charged exactly the
order's total without tax (the proof required it), so a paid order, and a cancelled one whose
money was refunded, is filled with tax 0 and its total

Revision ID: b3d5f7a9c1e2
Revises: b1d3f5a7c9e2
Create Date: 2026-12-05 08:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = 'b3d5f7a9c1e2'
down_revision = 'b1d3f5a7c9e2'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('orders') as batch:
        batch.add_column(sa.Column('tax', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('charged', sa.Integer(), nullable=True))
    op.execute(
        "UPDATE orders SET tax = 0, charged = total WHERE status = 'Paid' "
        "OR id IN (SELECT order_id FROM refunds WHERE order_id IS NOT NULL)"
    )


def downgrade():
    with op.batch_alter_table('orders') as batch:
        batch.drop_column('charged')
        batch.drop_column('tax')
