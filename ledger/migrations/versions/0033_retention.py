"""retention: a compacted checkpoint keeps the sha256 of its state and a seal over it
(checkpoints.state_sha256, compacted_mac; ledger/retention.py); a run on legal hold
(runs.legal_hold, the reason) is never compacted.

Revision ID: 0033
Revises: 0032
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0033'
down_revision = '0032'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('checkpoints', sa.Column('state_sha256', sa.Text(), nullable=True),
                  schema='onward')
    op.add_column('checkpoints', sa.Column('compacted_mac', sa.Text(), nullable=True),
                  schema='onward')
    op.add_column('runs', sa.Column('legal_hold', sa.Text(), nullable=True), schema='onward')


def downgrade() -> None:
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM onward.checkpoints WHERE compacted_mac IS NOT NULL) THEN
            RAISE EXCEPTION 'compacted checkpoints cannot be downgraded: their states are gone';
          END IF;
        END $$""")
    op.drop_column('runs', 'legal_hold', schema='onward')
    op.drop_column('checkpoints', 'compacted_mac', schema='onward')
    op.drop_column('checkpoints', 'state_sha256', schema='onward')
