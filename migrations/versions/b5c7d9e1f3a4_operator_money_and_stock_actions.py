"""operator money and stock actions: a refund an operator asked for (refunds.request_key, the
submission's idempotency key, with requested_by and restock; the one-refund-per-(order, session)
rule of late money becomes a unique index on the rows without a request key, since a paid order
may be refunded in several parts), email_resends (an email an operator sent again, one per
submission) and stock_corrections (every correction of a variant's stock: who, when, old -> new,
why)

Revision ID: b5c7d9e1f3a4
Revises: f9a1b3c5d7e9
Create Date: 2026-12-02 21:30:00

"""
from alembic import op
import sqlalchemy as sa
import shop.models.types


revision = 'b5c7d9e1f3a4'
down_revision = 'f9a1b3c5d7e9'
branch_labels = None
depends_on = None

LATE_MONEY = "request_key IS NULL"


def upgrade():
    with op.batch_alter_table('refunds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('request_key', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('requested_by', sa.String(length=254), nullable=True))
        batch_op.add_column(sa.Column('restock', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.drop_constraint('uq_refunds_order_session', type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_refunds_request_key'), ['request_key'])
        batch_op.create_index('uq_refunds_order_session', ['order_id', 'session_id'], unique=True,
                              postgresql_where=sa.text(LATE_MONEY), sqlite_where=sa.text(LATE_MONEY))
    op.create_table(
        'email_resends',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('order_id', sa.Integer(), nullable=False),
        sa.Column('template', sa.String(length=40), nullable=False),
        sa.Column('operator', sa.String(length=254), nullable=False),
        sa.Column('request_key', sa.String(length=64), nullable=False),
        sa.Column('command_id', sa.Integer(), nullable=True),
        sa.Column('created_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['order_id'], ['orders.id'], name=op.f('fk_email_resends_order_id_orders')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_email_resends')),
        sa.UniqueConstraint('request_key', name=op.f('uq_email_resends_request_key')),
    )
    with op.batch_alter_table('email_resends', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_email_resends_order_id'), ['order_id'], unique=False)
    op.create_table(
        'stock_corrections',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('variant_id', sa.Integer(), nullable=False),
        sa.Column('operator', sa.String(length=254), nullable=False),
        sa.Column('mode', sa.String(length=10), nullable=False),
        sa.Column('old_on_hand', sa.Integer(), nullable=False),
        sa.Column('new_on_hand', sa.Integer(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('request_key', sa.String(length=64), nullable=False),
        sa.Column('created_at', shop.models.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['variant_id'], ['variants.id'], name=op.f('fk_stock_corrections_variant_id_variants')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_stock_corrections')),
        sa.UniqueConstraint('request_key', name=op.f('uq_stock_corrections_request_key')),
    )
    with op.batch_alter_table('stock_corrections', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_stock_corrections_variant_id'), ['variant_id'], unique=False)


def downgrade():
    with op.batch_alter_table('stock_corrections', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_stock_corrections_variant_id'))
    op.drop_table('stock_corrections')
    with op.batch_alter_table('email_resends', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_email_resends_order_id'))
    op.drop_table('email_resends')
    # Operator refunds have no place in the old one-per-(order, session) rule.
    op.execute("DELETE FROM refunds WHERE request_key IS NOT NULL")
    with op.batch_alter_table('refunds', schema=None) as batch_op:
        batch_op.drop_index('uq_refunds_order_session')
        batch_op.drop_constraint(batch_op.f('uq_refunds_request_key'), type_='unique')
        batch_op.create_unique_constraint('uq_refunds_order_session', ['order_id', 'session_id'])
        batch_op.drop_column('restock')
        batch_op.drop_column('requested_by')
        batch_op.drop_column('request_key')
