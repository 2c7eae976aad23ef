"""checkpoint references: evidence, effects, budgets

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('checkpoints', sa.Column('refs', postgresql.JSONB(astext_type=sa.Text()), nullable=True), schema='onward')


def downgrade() -> None:
    op.drop_column('checkpoints', 'refs', schema='onward')
