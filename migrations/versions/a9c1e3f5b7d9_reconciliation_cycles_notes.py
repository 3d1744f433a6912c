"""reconciliation_cycles.notes: what a cycle did that is worth an operator's eye but is not an
error (it took over the lease of a process that died mid-cycle)

Revision ID: a9c1e3f5b7d9
Revises: f7b9d1e3a5c6
Create Date: 2026-12-01 19:40:00

"""
from alembic import op
import sqlalchemy as sa


revision = 'a9c1e3f5b7d9'
down_revision = 'f7b9d1e3a5c6'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('reconciliation_cycles', schema=None) as batch_op:
        batch_op.add_column(sa.Column('notes', sa.JSON(), nullable=True))


def downgrade():
    with op.batch_alter_table('reconciliation_cycles', schema=None) as batch_op:
        batch_op.drop_column('notes')
