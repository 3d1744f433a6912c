"""orders.shipped_at and orders.tracking: an order's fulfilment (when an operator shipped it, and
the carrier's tracking number when one was given). Older orders are unfulfilled. With
CAPTURE_MODE=dispatch, orders.hold_expires_at (when the provider's hold on an Authorized order's
payment lapses) and orders.capture_requested_at (the ship that captures it was asked, since when)

Revision ID: ba90e3581f47
Revises: b0cb6899d406
Create Date: 2026-12-05 16:30:00

"""

from alembic import op
import sqlalchemy as sa

import shop.models.types


revision = "ba90e3581f47"
down_revision = "b0cb6899d406"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("orders") as batch:
        batch.add_column(sa.Column("shipped_at", shop.models.types.UTCDateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("tracking", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("hold_expires_at", shop.models.types.UTCDateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("capture_requested_at", shop.models.types.UTCDateTime(timezone=True), nullable=True))


def downgrade():
    with op.batch_alter_table("orders") as batch:
        batch.drop_column("capture_requested_at")
        batch.drop_column("hold_expires_at")
        batch.drop_column("tracking")
        batch.drop_column("shipped_at")
