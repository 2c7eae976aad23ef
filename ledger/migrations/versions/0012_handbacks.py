"""hand-backs: how many times in a row workers handed a run back for a version they lack

Revision ID: 0012
Revises: 0011

A worker that claims a run bound to a newer workflow version than it has gives the lease
back without spending the attempt budget; this counts those hand-backs since the run's
last commit (or ``continue``), so that after ``ONWARD_HANDBACK_LIMIT`` of them the run is
parked ``no_worker_for_version`` instead of circulating forever.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('handbacks', sa.Integer(), server_default=sa.text('0'),
                                    nullable=False), schema='onward')


def downgrade() -> None:
    op.drop_column('runs', 'handbacks', schema='onward')
