"""checkpoint envelope 2: the MAC'd body names the run's workflow

Revision ID: 0010
Revises: 0009

Checkpoints written before this migration keep envelope version 1 and a NULL workflow:
their MAC covers no workflow name, and they still verify as version 1.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('checkpoints', sa.Column('workflow', sa.Text(), nullable=True), schema='onward')


def downgrade() -> None:
    op.drop_column('checkpoints', 'workflow', schema='onward')
