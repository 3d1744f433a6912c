"""operator_actions (the console's audit trail) and an index for searching orders by email

Revision ID: c4e6a8b0d2f3
Revises: b3d5e7f9a1c2
Create Date: 2026-12-01 11:45:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'c4e6a8b0d2f3'
down_revision = 'b3d5e7f9a1c2'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'operator_actions',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('operator', sa.String(length=254), nullable=False),
        sa.Column('action', sa.String(length=64), nullable=False),
        sa.Column('target', sa.String(length=200), nullable=False),
        sa.Column('order_id', sa.Integer(), nullable=True),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('status', sa.Integer(), nullable=False),
        sa.Column('outcome', sa.Text(), nullable=False),
        sa.Column('created_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_operator_actions')),
    )
    with op.batch_alter_table('operator_actions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_operator_actions_order_id'), ['order_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_operator_actions_created_at'), ['created_at'], unique=False)
    op.create_index('ix_orders_email_lower', 'orders', [sa.text('lower(email)')], unique=False)


def downgrade():
    op.drop_index('ix_orders_email_lower', table_name='orders')
    with op.batch_alter_table('operator_actions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_operator_actions_created_at'))
        batch_op.drop_index(batch_op.f('ix_operator_actions_order_id'))
    op.drop_table('operator_actions')
