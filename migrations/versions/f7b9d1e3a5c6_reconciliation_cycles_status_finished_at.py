"""index reconciliation_cycles by (status, finished_at) for the dashboard's "last successful sweep"

Revision ID: f7b9d1e3a5c6
Revises: e6a8c0d2f4b5
Create Date: 2026-12-01 15:00:00

"""
from alembic import op


revision = 'f7b9d1e3a5c6'
down_revision = 'e6a8c0d2f4b5'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('reconciliation_cycles', schema=None) as batch_op:
        batch_op.create_index('ix_reconciliation_cycles_status_finished_at', ['status', 'finished_at'], unique=False)


def downgrade():
    with op.batch_alter_table('reconciliation_cycles', schema=None) as batch_op:
        batch_op.drop_index('ix_reconciliation_cycles_status_finished_at')
