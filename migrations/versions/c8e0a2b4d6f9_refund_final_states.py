"""refunds follow their provider refund to its final state: attempts, the provider's failure
reason and when it came, an operator's settlement outside the shop; refunds found by provider id

Revision ID: c8e0a2b4d6f9
Revises: b7d9f1a3c5e8
Create Date: 2026-12-03 09:00:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'c8e0a2b4d6f9'
down_revision = 'b7d9f1a3c5e8'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('refunds', schema=None) as batch_op:
        # Every refund recorded before this had made (or was about to make) its first attempt.
        batch_op.add_column(sa.Column('attempts', sa.Integer(), server_default='1', nullable=False))
        batch_op.add_column(sa.Column('failure_reason', sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column('failed_at', shop.models.types.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('settled_at', shop.models.types.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('settled_by', sa.String(length=254), nullable=True))
        batch_op.add_column(sa.Column('settlement_reason', sa.Text(), nullable=True))
        batch_op.create_index(batch_op.f('ix_refunds_provider_refund_id'), ['provider_refund_id'], unique=False)


def downgrade():
    with op.batch_alter_table('refunds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_refunds_provider_refund_id'))
        batch_op.drop_column('settlement_reason')
        batch_op.drop_column('settled_by')
        batch_op.drop_column('settled_at')
        batch_op.drop_column('failed_at')
        batch_op.drop_column('failure_reason')
        batch_op.drop_column('attempts')
