"""idempotent_requests: a storefront POST sent with an Idempotency-Key and its first answer, kept
for a day, so that a JSON client's retry gets that answer again instead of acting twice

Revision ID: d5f7a9b1c3e5
Revises: c4e6a8b0d2f4
Create Date: 2026-12-05 12:50:00

"""

from alembic import op
import sqlalchemy as sa

import shop.models.types


revision = "d5f7a9b1c3e5"
down_revision = "c4e6a8b0d2f4"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "idempotent_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("answer_status", sa.Integer(), nullable=True),
        sa.Column("answer_headers", sa.JSON(), nullable=True),
        sa.Column("answer_body", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("completed_at", shop.models.types.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotent_requests")),
        sa.UniqueConstraint("scope", "key", name="uq_idempotent_requests_scope_key"),
    )
    op.create_index(op.f("ix_idempotent_requests_created_at"), "idempotent_requests", ["created_at"])


def downgrade():
    op.drop_index(op.f("ix_idempotent_requests_created_at"), table_name="idempotent_requests")
    op.drop_table("idempotent_requests")
