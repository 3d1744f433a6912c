"""retention: pruned_order_details (what the prune removed of each order's detail, for its console
page), and the indexes that make the prune's selection a range scan: finished scheduled commands
by completion (partial: pending ones, which checkout inserts, stay out of it) and applied provider
events by time

Revision ID: f2b4d6e8a0c1
Revises: e1a3c5d7f9b2
Create Date: 2026-12-02 14:30:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'f2b4d6e8a0c1'
down_revision = 'e1a3c5d7f9b2'
branch_labels = None
depends_on = None

FINISHED = "completed_at IS NOT NULL"


def upgrade():
    op.create_table(
        'pruned_order_details',
        sa.Column('order_id', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('deliveries', sa.Integer(), server_default='0', nullable=False),
        sa.Column('commands', sa.Integer(), server_default='0', nullable=False),
        sa.Column('webhook_receipts', sa.Integer(), server_default='0', nullable=False),
        sa.Column('operator_actions', sa.Integer(), server_default='0', nullable=False),
        sa.Column('first_pruned_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column('last_pruned_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('order_id', name=op.f('pk_pruned_order_details')),
    )
    with op.batch_alter_table('scheduled_commands', schema=None) as batch_op:
        batch_op.create_index('ix_scheduled_commands_completed_at', ['completed_at'], unique=False,
                              postgresql_where=sa.text(FINISHED), sqlite_where=sa.text(FINISHED))
    with op.batch_alter_table('processed_stripe_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_processed_stripe_events_processed_at'), ['processed_at'], unique=False)


def downgrade():
    with op.batch_alter_table('processed_stripe_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_processed_stripe_events_processed_at'))
    with op.batch_alter_table('scheduled_commands', schema=None) as batch_op:
        batch_op.drop_index('ix_scheduled_commands_completed_at')
    op.drop_table('pruned_order_details')
