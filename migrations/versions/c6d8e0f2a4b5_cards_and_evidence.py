"""Evidence for the console's cards: each webhook receipt keeps its raw body, the address it came
from and whether its signature verified (noise from the internet is told apart from the
provider's own deliveries failing); a failed payment start records whether the provider refused
or could not be reached; an operator's acknowledgement of a red card (who, why, until when, and
the condition it acknowledged)

Revision ID: c6d8e0f2a4b5
Revises: b5c7d9e1f3a4
Create Date: 2026-12-02 21:30:00

"""
from alembic import op
import sqlalchemy as sa

from shop.models.types import UTCDateTime


revision = 'c6d8e0f2a4b5'
down_revision = 'b5c7d9e1f3a4'
branch_labels = None
depends_on = None


def upgrade():
    # Nullable, no default: a catalog change only on PostgreSQL. Older receipts keep NULL
    # (`signed` unknown: the card counts them as it did before, as failures).
    with op.batch_alter_table('webhook_receipts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('source_address', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('body', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('signed', sa.Boolean(), nullable=True))
    with op.batch_alter_table('provider_refusals', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=20), nullable=False, server_default='refused'))
    op.create_table(
        'card_acknowledgements',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('card', sa.String(length=40), nullable=False),
        sa.Column('condition', sa.String(length=200), nullable=False),
        sa.Column('operator', sa.String(length=254), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('until', UTCDateTime(timezone=True), nullable=False),
        sa.Column('created_at', UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('card_acknowledgements', schema=None) as batch_op:
        batch_op.create_index('ix_card_acknowledgements_card_created_at', ['card', 'created_at'], unique=False)


def downgrade():
    with op.batch_alter_table('card_acknowledgements', schema=None) as batch_op:
        batch_op.drop_index('ix_card_acknowledgements_card_created_at')
    op.drop_table('card_acknowledgements')
    with op.batch_alter_table('provider_refusals', schema=None) as batch_op:
        batch_op.drop_column('kind')
    with op.batch_alter_table('webhook_receipts', schema=None) as batch_op:
        batch_op.drop_column('signed')
        batch_op.drop_column('body')
        batch_op.drop_column('source_address')
