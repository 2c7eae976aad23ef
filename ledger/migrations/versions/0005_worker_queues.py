"""worker queues per workflow version

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('worker_queues',
    sa.Column('queue', sa.Text(), nullable=False),
    sa.Column('workflow', sa.Text(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('seen_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('queue', name=op.f('pk_worker_queues')),
    schema='onward'
    )


def downgrade() -> None:
    op.drop_table('worker_queues', schema='onward')
