"""orders.provider_next_check_at: the sweep backs off orders whose provider answer cannot change soon

Revision ID: 7a1f0c2d9e4b
Revises: 3c97d1ebb942
Create Date: 2026-11-30 05:50:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = '7a1f0c2d9e4b'
down_revision = '3c97d1ebb942'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.add_column(sa.Column('provider_next_check_at', shop.models.types.UTCDateTime(timezone=True),
                                      nullable=True))


def downgrade():
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_column('provider_next_check_at')
