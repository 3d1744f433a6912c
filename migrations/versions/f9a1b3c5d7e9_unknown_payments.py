"""unknown_payments: money the provider holds for a session naming no order this database knows
(a restored copy older than the payment), checked, then applied or refunded

Revision ID: f9a1b3c5d7e9
Revises: a3c5e7f9b1d2
Create Date: 2026-12-02 21:30:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'f9a1b3c5d7e9'
down_revision = 'a3c5e7f9b1d2'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'unknown_payments',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('session_id', sa.String(length=255), nullable=False),
        sa.Column('payment_intent_id', sa.String(length=255), nullable=True),
        sa.Column('amount', sa.Integer(), nullable=True),
        sa.Column('currency', sa.String(length=3), nullable=True),
        sa.Column('reference', sa.String(length=255), nullable=True),
        sa.Column('found_via', sa.String(length=40), nullable=False),
        sa.Column('status', sa.String(length=20), nullable=False),
        sa.Column('provider_refund_id', sa.String(length=255), nullable=True),
        sa.Column('detail', sa.Text(), nullable=False),
        sa.Column('created_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column('updated_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('session_id'),
    )
    with op.batch_alter_table('unknown_payments', schema=None) as batch_op:
        batch_op.create_index('ix_unknown_payments_created_at', ['created_at'], unique=False)


def downgrade():
    with op.batch_alter_table('unknown_payments', schema=None) as batch_op:
        batch_op.drop_index('ix_unknown_payments_created_at')
    op.drop_table('unknown_payments')
