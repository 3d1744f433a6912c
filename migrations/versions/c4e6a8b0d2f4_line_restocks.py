"""order_lines.restocked and refund_restocks: an operator's refund puts back a chosen number of
each line's units; each line counts what went back (never more than was bought), and each refund
records what it put back, line by line, with the stock before and after. Orders whose stock was
already put back in full count every unit of every line as back

Revision ID: c4e6a8b0d2f4
Revises: b3d5f7a9c1e2
Create Date: 2026-12-05 08:10:00

"""

from alembic import op
import sqlalchemy as sa


revision = "c4e6a8b0d2f4"
down_revision = "b3d5f7a9c1e2"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("order_lines") as batch:
        batch.add_column(sa.Column("restocked", sa.Integer(), nullable=False, server_default="0"))
        batch.create_check_constraint(
            op.f("ck_order_lines_restocked_within_quantity"), "restocked >= 0 AND restocked <= quantity"
        )
    op.execute(
        "UPDATE order_lines SET restocked = quantity WHERE order_id IN (SELECT id FROM orders WHERE inventory_restored)"
    )
    op.create_table(
        "refund_restocks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("refund_id", sa.Integer(), nullable=False),
        sa.Column("line_id", sa.Integer(), nullable=False),
        sa.Column("variant_id", sa.Integer(), nullable=False),
        sa.Column("sku", sa.String(length=64), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.Column("on_hand_before", sa.Integer(), nullable=False),
        sa.Column("on_hand_after", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["refund_id"], ["refunds.id"], name=op.f("fk_refund_restocks_refund_id_refunds")),
        sa.ForeignKeyConstraint(["line_id"], ["order_lines.id"], name=op.f("fk_refund_restocks_line_id_order_lines")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_refund_restocks")),
        sa.UniqueConstraint("refund_id", "line_id", name=op.f("uq_refund_restocks_refund_id")),
        sa.CheckConstraint("quantity > 0", name=op.f("ck_refund_restocks_quantity_positive")),
    )


def downgrade():
    op.drop_table("refund_restocks")
    with op.batch_alter_table("order_lines") as batch:
        batch.drop_constraint(op.f("ck_order_lines_restocked_within_quantity"), type_="check")
        batch.drop_column("restocked")
