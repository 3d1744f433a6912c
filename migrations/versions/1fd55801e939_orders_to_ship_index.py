"""ix_orders_to_ship: the console's to-ship list (GET /console/shipping, oldest first) reads only
the paid or authorized orders with goods not yet shipped, however many orders the years left

Revision ID: 1fd55801e939
Revises: ba90e3581f47
Create Date: 2026-12-06 03:00:00

"""

from alembic import op
import sqlalchemy as sa


revision = "1fd55801e939"
down_revision = "ba90e3581f47"
branch_labels = None
depends_on = None

# As shop.models.orders.TO_SHIP says it (the query's own terms) when this revision was written.
TO_SHIP = (
    "ships = true AND shipped_at IS NULL AND capture_requested_at IS NULL "
    "AND status IN ('Paid', 'Authorized')"
)


def upgrade():
    op.create_index(
        "ix_orders_to_ship",
        "orders",
        ["updated_at", "id"],
        unique=False,
        postgresql_where=sa.text(TO_SHIP),
        sqlite_where=sa.text(TO_SHIP),
    )


def downgrade():
    op.drop_index("ix_orders_to_ship", table_name="orders")
