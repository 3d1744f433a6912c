"""orders.client_address: the address a checkout came from, so the live unpaid orders of one
client address can be counted (UNPAID_ORDERS_PER_ADDRESS) and the order emails about its
orders capped. Older orders have none and count for no address

Revision ID: e6b8d0f2a4c7
Revises: d5f7a9b1c3e5
Create Date: 2026-12-05 12:00:00

"""

from alembic import op
import sqlalchemy as sa


revision = "e6b8d0f2a4c7"
down_revision = "d5f7a9b1c3e5"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("orders") as batch:
        batch.add_column(sa.Column("client_address", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_orders_client_address"), "orders", ["client_address"], unique=False)


def downgrade():
    op.drop_index(op.f("ix_orders_client_address"), table_name="orders")
    with op.batch_alter_table("orders") as batch:
        batch.drop_column("client_address")
