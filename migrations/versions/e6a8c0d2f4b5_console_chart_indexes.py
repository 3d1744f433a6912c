"""console dashboard indexes: events by name and time, deliveries by completion, webhooks by outcome

Revision ID: e6a8c0d2f4b5
Revises: d5f7b9c1e3a4
Create Date: 2026-12-02 12:00:00

"""
from alembic import op


revision = 'e6a8c0d2f4b5'
down_revision = 'd5f7b9c1e3a4'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('outbox_events', schema=None) as batch_op:
        batch_op.create_index('ix_outbox_events_name_created_at', ['name', 'created_at'], unique=False)
    with op.batch_alter_table('outbox_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_outbox_deliveries_completed_at', ['completed_at'], unique=False)
    with op.batch_alter_table('webhook_receipts', schema=None) as batch_op:
        batch_op.create_index('ix_webhook_receipts_outcome_received_at', ['outcome', 'received_at'], unique=False)


def downgrade():
    with op.batch_alter_table('webhook_receipts', schema=None) as batch_op:
        batch_op.drop_index('ix_webhook_receipts_outcome_received_at')
    with op.batch_alter_table('outbox_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_outbox_deliveries_completed_at')
    with op.batch_alter_table('outbox_events', schema=None) as batch_op:
        batch_op.drop_index('ix_outbox_events_name_created_at')
