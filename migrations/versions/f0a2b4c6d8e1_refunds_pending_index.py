"""ix_refunds_pending_updated_at: the sweep's follow-up of pending refunds reads only the pending
ones, oldest news first, however many refunds the years left; and the created_at indexes the
prune walks for an operator's other records (emails sent again, stock corrections, card
acknowledgements)

Revision ID: f0a2b4c6d8e1
Revises: d7e9f1a3b5c6
Create Date: 2026-12-02 22:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = 'f0a2b4c6d8e1'
down_revision = 'd7e9f1a3b5c6'
branch_labels = None
depends_on = None


def upgrade():
    op.create_index('ix_refunds_pending_updated_at', 'refunds', ['updated_at'], unique=False,
                    postgresql_where=sa.text("status = 'pending'"), sqlite_where=sa.text("status = 'pending'"))
    for table in ('email_resends', 'stock_corrections', 'card_acknowledgements'):
        op.create_index(f'ix_{table}_created_at', table, ['created_at'], unique=False)


def downgrade():
    for table in ('email_resends', 'stock_corrections', 'card_acknowledgements'):
        op.drop_index(f'ix_{table}_created_at', table_name=table)
    op.drop_index('ix_refunds_pending_updated_at', table_name='refunds')
