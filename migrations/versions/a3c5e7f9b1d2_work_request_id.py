"""outbox_deliveries.request_id and scheduled_commands.request_id: the id of the web request
whose commit wrote the row, so the lines of whoever runs it carry that request's id (shop.logs)

Revision ID: a3c5e7f9b1d2
Revises: f2b4d6e8a0c1
Create Date: 2026-12-02 14:30:00

"""
from alembic import op
import sqlalchemy as sa


revision = 'a3c5e7f9b1d2'
down_revision = 'f2b4d6e8a0c1'
branch_labels = None
depends_on = None


def upgrade():
    # Nullable, no default: adding it rewrites nothing on PostgreSQL (a catalog change only).
    with op.batch_alter_table('outbox_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('request_id', sa.String(length=64), nullable=True))
    with op.batch_alter_table('scheduled_commands', schema=None) as batch_op:
        batch_op.add_column(sa.Column('request_id', sa.String(length=64), nullable=True))


def downgrade():
    with op.batch_alter_table('scheduled_commands', schema=None) as batch_op:
        batch_op.drop_column('request_id')
    with op.batch_alter_table('outbox_deliveries', schema=None) as batch_op:
        batch_op.drop_column('request_id')
