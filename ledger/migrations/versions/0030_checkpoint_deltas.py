"""checkpoint deltas: a checkpoint stores its state in full (a snapshot) or as an RFC 6902
patch from its parent's state (checkpoints.state_delta, snapshot_seq, chain_bytes;
ledger/states.py). Existing rows are snapshots; nothing is rewritten.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('checkpoints', sa.Column('state_delta', JSONB(), nullable=True),
                  schema='onward')
    op.add_column('checkpoints', sa.Column('snapshot_seq', sa.Integer(), nullable=True),
                  schema='onward')
    op.add_column('checkpoints', sa.Column('chain_bytes', sa.Integer(), nullable=True),
                  schema='onward')
    op.alter_column('checkpoints', 'state', nullable=True, schema='onward')
    op.create_check_constraint(
        op.f('ck_checkpoints_delta'), 'checkpoints',
        'state_delta IS NULL OR state IS NULL', schema='onward')


def downgrade() -> None:
    # a delta row has no state of its own: a downgrade needs every state in full first
    op.execute("""
        DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM onward.checkpoints WHERE state IS NULL) THEN
            RAISE EXCEPTION 'checkpoints stored as deltas (or compacted) cannot be downgraded: '
                            'their states are not stored in full';
          END IF;
        END $$""")
    op.drop_constraint(op.f('ck_checkpoints_delta'), 'checkpoints', type_='check',
                       schema='onward')
    op.alter_column('checkpoints', 'state', nullable=False, schema='onward')
    op.drop_column('checkpoints', 'chain_bytes', schema='onward')
    op.drop_column('checkpoints', 'snapshot_seq', schema='onward')
    op.drop_column('checkpoints', 'state_delta', schema='onward')
