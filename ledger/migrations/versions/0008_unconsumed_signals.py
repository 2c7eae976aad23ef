"""unconsumed signals: a partial index for the reaper's wake of runs whose signal came first

Revision ID: 0008
Revises: 0007

A waiting commit consumes a signal sent before the wait began in its own statement; a
signal committed while that statement runs is outside its snapshot, and the reaper wakes
such runs. This index keeps that sweep proportional to the signals nobody consumed yet.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_signals_unconsumed', 'signals', ['run_id', 'name'], unique=False,
                    schema='onward', postgresql_where=sa.text('consumed_seq IS NULL'))


def downgrade() -> None:
    op.drop_index('ix_signals_unconsumed', table_name='signals', schema='onward')
