"""durable work: failure_kind and provider_waits (a row waiting for an unavailable provider is retried without spending its attempt budget)

Revision ID: c4e6a8b0d2f1
Revises: c4e6a8b0d2f3
Create Date: 2026-12-02 10:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = 'c4e6a8b0d2f1'
down_revision = 'c4e6a8b0d2f3'
branch_labels = None
depends_on = None

TABLES = ('outbox_deliveries', 'scheduled_commands')


def upgrade():
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('failure_kind', sa.String(length=16), nullable=True))
            batch_op.add_column(sa.Column('provider_waits', sa.Integer(), server_default='0', nullable=False))


def downgrade():
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('provider_waits')
            batch_op.drop_column('failure_kind')
