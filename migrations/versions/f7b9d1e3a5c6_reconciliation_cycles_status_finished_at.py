"""index reconciliation_cycles by (status, finished_at) for the dashboard's "last successful sweep",
and the pending durable work that failed (partial) for the outbox's "waiting for the provider"

Revision ID: f7b9d1e3a5c6
Revises: e6a8c0d2f4b5
Create Date: 2026-12-01 15:00:00

"""
from alembic import op
import sqlalchemy as sa

WAITING = "status = 'pending' AND failure_kind IS NOT NULL"


revision = 'f7b9d1e3a5c6'
down_revision = 'e6a8c0d2f4b5'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('reconciliation_cycles', schema=None) as batch_op:
        batch_op.create_index('ix_reconciliation_cycles_status_finished_at', ['status', 'finished_at'], unique=False)
    for table in ('outbox_deliveries', 'scheduled_commands'):
        op.create_index(f'ix_{table}_pending_failure_kind', table, ['failure_kind'], unique=False,
                        postgresql_where=sa.text(WAITING), sqlite_where=sa.text(WAITING))


def downgrade():
    for table in ('scheduled_commands', 'outbox_deliveries'):
        op.drop_index(f'ix_{table}_pending_failure_kind', table_name=table)
    with op.batch_alter_table('reconciliation_cycles', schema=None) as batch_op:
        batch_op.drop_index('ix_reconciliation_cycles_status_finished_at')
