"""operators.session_generation: the counter every operator session carries and every console
request compares, so a logout, "log out everywhere" or a new password ends all of that operator's
sessions (a signed cookie session cannot be revoked by itself)

Revision ID: e1a3c5d7f9b2
Revises: d9f1b3c5e7a0
Create Date: 2026-12-02 11:30:00

"""
from alembic import op
import sqlalchemy as sa


revision = 'e1a3c5d7f9b2'
down_revision = 'd9f1b3c5e7a0'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('operators', schema=None) as batch_op:
        batch_op.add_column(sa.Column('session_generation', sa.Integer(), server_default='0', nullable=False))


def downgrade():
    with op.batch_alter_table('operators', schema=None) as batch_op:
        batch_op.drop_column('session_generation')
