"""provider_refusals: why the provider would not start a payment, for the order's timeline

Revision ID: d5f7b9c1e3a4
Revises: c4e6a8b0d2f1
Create Date: 2026-12-01 12:00:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'd5f7b9c1e3a4'
down_revision = 'c4e6a8b0d2f1'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'provider_refusals',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('order_id', sa.Integer(), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('code', sa.String(length=100), nullable=True),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('created_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['order_id'], ['orders.id'], ),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('provider_refusals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_provider_refusals_order_id'), ['order_id'], unique=False)


def downgrade():
    with op.batch_alter_table('provider_refusals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_provider_refusals_order_id'))
    op.drop_table('provider_refusals')
